/* A disk that stalls, for the daemon's process: LD_PRELOAD this library and every
 * fsync() and fdatasync() first sleeps for the milliseconds written in the file that
 * SLOW_SYNC_FILE names, while that file exists (no file: no stall). Each stall appends
 * one line "<call> <ms>" to SLOW_SYNC_LOG as it begins, so a test knows one is under way. The real call
 * follows, found with dlsym(RTLD_NEXT). errno is kept as the caller would see it. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static void stall(const char *call) {
    const char *path = getenv("SLOW_SYNC_FILE");
    if (path == NULL)
        return;
    int saved = errno;
    long ms = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
        char buf[32] = {0};
        ssize_t n = read(fd, buf, sizeof buf - 1);
        close(fd);
        if (n > 0)
            ms = strtol(buf, NULL, 10);
    }
    if (ms > 0) {
        const char *log = getenv("SLOW_SYNC_LOG");
        if (log != NULL) { /* before the sleep: a reader sees a stall under way */
            int lfd = open(log, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0600);
            if (lfd >= 0) {
                char line[64];
                int len = snprintf(line, sizeof line, "%s %ld\n", call, ms);
                if (len > 0 && write(lfd, line, (size_t)len) < 0) {
                }
                close(lfd);
            }
        }
        struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
        while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
        }
    }
    errno = saved;
}

int fsync(int fd) {
    static int (*real)(int);
    if (real == NULL)
        real = (int (*)(int))dlsym(RTLD_NEXT, "fsync");
    stall("fsync");
    return real(fd);
}

int fdatasync(int fd) {
    static int (*real)(int);
    if (real == NULL)
        real = (int (*)(int))dlsym(RTLD_NEXT, "fdatasync");
    stall("fdatasync");
    return real(fd);
}
