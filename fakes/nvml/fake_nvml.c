/*
 * fake_nvml.c: a small stand-in for libnvidia-ml.so.1, loaded by the real pynvml
 * ctypes bindings in the tests.
 *
 * It exports only the NVML symbols dra_plugin/vendors/nvidia/nvml.py reaches through pynvml, with
 * the struct layouts pynvml declares (nvmlPciInfo_t, nvmlMemory_t, nvmlEventData_t,
 * nvmlGpuInstanceInfo_t).
 *
 * FAKE_NVML_PROFILE names a profile file, read at every first nvmlInit (refcount 0->1):
 *
 *     # comment
 *     driver_version = 535.104.05
 *     cuda_driver_version = 12020
 *     init_error = 9                  (optional: nvmlInit returns this NVML code)
 *     [gpu]
 *     name = NVIDIA H200
 *     uuid = GPU-...
 *     minor = 0
 *     brand = 2                       (NVML_BRAND_*)
 *     architecture = 9                (NVML_DEVICE_ARCH_*)
 *     cuda_cc = 9.0
 *     memory_total = 150754820096
 *     pci_bus_id = 00000000:1B:00.0
 *     pcie_link = 5 16 5 16           (current gen, current width, max gen, max width;
 *                                      a 0 means "not supported")
 *     mig_mode = 1                    (absent: MIG not supported)
 *     addressing_mode = 1             (NVML_DEVICE_ADDRESSING_MODE_*; absent: the call
 *                                      answers NVML_ERROR_NOT_SUPPORTED)
 *     gi_profile = 0 19 1 7 14 1 0 0 0 0 4864
 *                                     (a GPU instance profile: NVML_GPU_INSTANCE_PROFILE_*
 *                                      index, then nvmlGpuInstanceProfileInfo_t's id,
 *                                      sliceCount, instanceCount, multiprocessorCount,
 *                                      copyEngineCount, decoderCount, encoderCount,
 *                                      jpegCount, ofaCount, memorySizeMB; one line each)
 *                                      then optionally its name, e.g. 1g.18gb)
 *     gi_placements = 0 0+1 1+1 2+1   (the possible placements of the profile with that
 *                                      index, start+size)
 *     supported_events = 0xb
 *   telemetry (each key absent: the call answers NVML_ERROR_NOT_SUPPORTED):
 *     utilization = 87 45             (gpu %, memory %)
 *     memory_used = 1073741824        (bytes; default total / 100)
 *     temperature = 61                (degrees C, the GPU sensor)
 *     power = 412000 700000           (usage mW, enforced limit mW)
 *     energy = 5000000                (mJ at init; every read adds 1000 mJ)
 *     clocks = 1980 2619              (SM MHz, memory MHz)
 *     ecc = 2 0                       (volatile corrected, uncorrected)
 *     throttle = 0x4                  (clock event reason bits)
 *     utilization_delay_ms = 8000     (nvmlDeviceGetUtilizationRates takes this long: a
 *                                      GPU that answers slowly; no lock is held meanwhile)
 *     [mig]                           (belongs to the [gpu] above it)
 *     name = NVIDIA H200 MIG 1g.18gb
 *     uuid = MIG-...
 *     gpu_instance_id = 13            (optional with a placement, which fixes it: see
 *                                      placement_id; a different one fails nvmlInit)
 *     compute_instance_id = 0
 *     profile_id = 19
 *     placement = 6 1
 *     memory_total = 17716740096
 *
 * FAKE_NVML_EVENTS names a file the test appends lines to; nvmlEventSetWait_v2 reads
 * the next complete line (each event set keeps its own offset):
 *     xid <gpu index> <code> [<gi> <ci>]   an XID event (gi/ci default: whole GPU)
 *     ecc <gpu index>                      a double-bit ECC event
 *     lost <gpu index>                     the GPU is lost: device calls fail, and every
 *                                          wait on a set holding it returns
 *                                          NVML_ERROR_GPU_IS_LOST at once (as a real
 *                                          driver does after XID 79) until "recover"
 *     fail <gpu index>                     device calls start failing (NVML_ERROR_UNKNOWN)
 *     recover <gpu index>                  the GPU answers again
 *     set <gpu index> <key> = <value>      change a profile key (e.g. a counter)
 *
 * MIG instances can be made and destroyed through the API (nvmlDeviceCreateGpuInstance
 * (WithPlacement), nvmlGpuInstanceCreateComputeInstance(WithPlacement),
 * nvmlComputeInstanceDestroy, nvmlGpuInstanceDestroy, and the lookups and remaining
 * capacities around them) with the driver's rules; see "MIG instances made and destroyed".
 * FAKE_NVML_CAPS_ROOT names a fake /proc/driver/nvidia/capabilities: the access files of
 * the instances made appear and go there. FAKE_NVML_MIG_STATE names a file that keeps the
 * instances made across processes (real instances outlive the process that made them):
 * one line per instance made through the API ("gi <gpu index> <gi id> <profile index>
 * <start> <size> <has ci> <uuid>"), rewritten whole (temporary file + rename) after every
 * create and destroy, read at every first nvmlInit; a process killed at any point leaves
 * either the state before or after its last call. FAKE_NVML_MIG_MINORS names a fake
 * /proc/driver/nvidia-caps/mig-minors ("gpuG/giI/access <minor>", "gpuG/giI/ciC/access
 * <minor>"), written at nvmlInit; an access file's DeviceFileMinor is its minor there.
 *
 * FAKE_NVML_CALL_LOG names a file that gets one line "utilization <gpu index>" per
 * nvmlDeviceGetUtilizationRates call, so tests can count how often the GPU was sampled,
 * "utilization-done <gpu index>" when a delayed call returns, and "wait -1" per
 * nvmlEventSetWait_v2 call.
 */
#include <ctype.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

typedef int nvmlReturn_t;
enum {
    NVML_SUCCESS = 0,
    NVML_ERROR_UNINITIALIZED = 1,
    NVML_ERROR_INVALID_ARGUMENT = 2,
    NVML_ERROR_NOT_SUPPORTED = 3,
    NVML_ERROR_NO_PERMISSION = 4,
    NVML_ERROR_NOT_FOUND = 6,
    NVML_ERROR_INSUFFICIENT_SIZE = 7,
    NVML_ERROR_DRIVER_NOT_LOADED = 9,
    NVML_ERROR_TIMEOUT = 10,
    NVML_ERROR_LIBRARY_NOT_FOUND = 12,
    NVML_ERROR_GPU_IS_LOST = 15,
    NVML_ERROR_IN_USE = 19,
    NVML_ERROR_INSUFFICIENT_RESOURCES = 23,
    NVML_ERROR_LIB_RM_VERSION_MISMATCH = 18,
    NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25,
    NVML_ERROR_UNKNOWN = 999,
};

#define EVENT_SBE 0x1ULL
#define EVENT_DBE 0x2ULL
#define EVENT_XID 0x8ULL
#define FULL_INSTANCE 0xFFFFFFFFu
#define MAX_GPUS 64
#define MAX_MIGS 64
#define MAX_MIG_PER_GPU 7
#define TEXT 96
#define GI_PROFILE_COUNT 18
#define MAX_PLACEMENTS 8

typedef struct {
    int present;
    char name[24]; /* e.g. "1g.18gb"; empty: "<slices>g.<GiB, rounded up>gb" */
    unsigned id, slices, instances, sm, ce, dec, enc, jpeg, ofa;
    unsigned long long memory_mib;
    unsigned nplacements;
    unsigned placements[MAX_PLACEMENTS][2];
} gi_profile;

typedef struct {
    int is_mig;
    int gpu; /* own index for GPUs, parent index for MIG devices */
    char name[TEXT];
    char uuid[TEXT];
    unsigned minor, brand, arch, cc_major, cc_minor;
    unsigned long long memory;
    char bus_id[32];
    unsigned domain, bus, device, function;
    unsigned pci_device_id, pci_subsystem_id;
    unsigned link[4];
    int mig_mode; /* -1: not supported */
    int addressing_mode; /* -1: not supported */
    gi_profile profiles[GI_PROFILE_COUNT];
    unsigned long long supported_events;
    unsigned gi, ci, profile_id, placement_start, placement_size;
    /* MIG devices made through the API (nvmlDeviceCreateGpuInstanceWithPlacement): the GPU
     * instance exists from its creation; it is a MIG device only once it has a compute
     * instance (has_ci). Static [mig] sections have both from the start. */
    int dynamic, dead, has_ci;
    unsigned profile_index;
    /* telemetry; has_* 0: not supported */
    int has_util, has_temp, has_power, has_energy, has_clocks, has_ecc, has_throttle;
    unsigned util_gpu, util_mem, temp, power_mw, power_limit_mw, clock_sm, clock_mem;
    volatile unsigned util_delay_ms;
    unsigned long long memory_used, energy_mj, ecc_corrected, ecc_uncorrected, throttle;
    volatile int lost, failing;
} fake_dev;

/* Layouts as pynvml declares them. */
typedef struct {
    char busIdLegacy[16];
    unsigned domain, bus, device, pciDeviceId, pciSubSystemId;
    char busId[32];
} nvmlPciInfo_t;
typedef struct {
    unsigned long long total, free, used;
} nvmlMemory_t;
typedef struct {
    unsigned version;
    unsigned long long total, reserved, free, used;
} nvmlMemory_v2_t;
typedef struct {
    void *device;
    unsigned long long eventType, eventData;
    unsigned gpuInstanceId, computeInstanceId;
} nvmlEventData_t;
typedef struct {
    void *device;
    unsigned id, profileId;
    unsigned start, size;
} nvmlGpuInstanceInfo_t;

typedef struct {
    unsigned id, isP2pSupported, sliceCount, instanceCount, multiprocessorCount,
        copyEngineCount, decoderCount, encoderCount, jpegCount, ofaCount;
    unsigned long long memorySizeMB;
} nvmlGpuInstanceProfileInfo_t;
typedef struct {
    unsigned version, id, isP2pSupported, sliceCount, instanceCount, multiprocessorCount,
        copyEngineCount, decoderCount, encoderCount, jpegCount, ofaCount;
    unsigned long long memorySizeMB;
    char name[96];
} nvmlGpuInstanceProfileInfo_v2_t;
typedef struct {
    unsigned start, size;
} nvmlGpuInstancePlacement_t;
typedef struct {
    unsigned version, value;
} nvmlDeviceAddressingMode_t;

typedef struct {
    unsigned gpu, memory;
} nvmlUtilization_t;
typedef struct {
    unsigned long long mask[MAX_GPUS];
    long offset;
} fake_event_set;

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static int g_refcount;
static int g_init_error;
static char g_driver_version[80];
static int g_cuda_version;
static fake_dev g_gpus[MAX_GPUS];
static int g_ngpus;
static fake_dev g_migs[MAX_MIGS];
static int g_nmigs;
/* Compute instance handles, one per MIG slot (a CI handle is not a device handle). */
typedef struct {
    fake_dev *mig;
} fake_ci;
static fake_ci g_cis[MAX_MIGS];
static unsigned g_created; /* GPU instances created so far: new MIG UUIDs each time */

static char *trim(char *s) {
    while (isspace((unsigned char)*s)) s++;
    char *end = s + strlen(s);
    while (end > s && isspace((unsigned char)end[-1])) *--end = '\0';
    return s;
}

static void copy_text(char *dst, size_t size, const char *src) {
    snprintf(dst, size, "%s", src);
}

static unsigned long long number(const char *s) { return strtoull(s, NULL, 0); }

static void new_device(fake_dev *d, int is_mig, int gpu) {
    memset(d, 0, sizeof(*d));
    d->has_ci = 1;
    d->is_mig = is_mig;
    d->gpu = gpu;
    d->mig_mode = -1;
    d->addressing_mode = -1;
    d->arch = 0xffffffffu;
    d->supported_events = EVENT_SBE | EVENT_DBE | EVENT_XID;
    d->gi = d->ci = FULL_INSTANCE;
}

static void set_gi_profile(fake_dev *d, const char *val) {
    unsigned index;
    gi_profile p = {.present = 1};
    int got = sscanf(val, "%u %u %u %u %u %u %u %u %u %u %llu %23s", &index, &p.id, &p.slices,
                     &p.instances, &p.sm, &p.ce, &p.dec, &p.enc, &p.jpeg, &p.ofa,
                     &p.memory_mib, p.name);
    if (got < 11 || index >= GI_PROFILE_COUNT) {
        fprintf(stderr, "fake_nvml: bad gi_profile: %s\n", val);
        return;
    }
    d->profiles[index] = p;
}

static void set_gi_placements(fake_dev *d, const char *val) {
    unsigned index;
    int used = 0;
    if (sscanf(val, "%u%n", &index, &used) != 1 || index >= GI_PROFILE_COUNT) {
        fprintf(stderr, "fake_nvml: bad gi_placements: %s\n", val);
        return;
    }
    gi_profile *p = &d->profiles[index];
    const char *s = val + used;
    unsigned start, size;
    int n;
    p->nplacements = 0;
    while (p->nplacements < MAX_PLACEMENTS && sscanf(s, " %u+%u%n", &start, &size, &n) == 2) {
        p->placements[p->nplacements][0] = start;
        p->placements[p->nplacements][1] = size;
        p->nplacements++;
        s += n;
    }
}

static void set_key(fake_dev *d, const char *key, const char *val) {
    if (!strcmp(key, "name")) copy_text(d->name, sizeof d->name, val);
    else if (!strcmp(key, "uuid")) copy_text(d->uuid, sizeof d->uuid, val);
    else if (!strcmp(key, "minor")) d->minor = (unsigned)number(val);
    else if (!strcmp(key, "brand")) d->brand = (unsigned)number(val);
    else if (!strcmp(key, "architecture")) d->arch = (unsigned)number(val);
    else if (!strcmp(key, "cuda_cc")) sscanf(val, "%u.%u", &d->cc_major, &d->cc_minor);
    else if (!strcmp(key, "memory_total")) d->memory = number(val);
    else if (!strcmp(key, "pci_bus_id")) {
        copy_text(d->bus_id, sizeof d->bus_id, val);
        sscanf(val, "%x:%x:%x.%x", &d->domain, &d->bus, &d->device, &d->function);
    } else if (!strcmp(key, "pci_device_id")) d->pci_device_id = (unsigned)number(val);
    else if (!strcmp(key, "pci_subsystem_id")) d->pci_subsystem_id = (unsigned)number(val);
    else if (!strcmp(key, "pcie_link"))
        sscanf(val, "%u %u %u %u", &d->link[0], &d->link[1], &d->link[2], &d->link[3]);
    else if (!strcmp(key, "mig_mode")) d->mig_mode = (int)number(val);
    else if (!strcmp(key, "addressing_mode")) d->addressing_mode = (int)number(val);
    else if (!strcmp(key, "gi_profile")) set_gi_profile(d, val);
    else if (!strcmp(key, "gi_placements")) set_gi_placements(d, val);
    else if (!strcmp(key, "supported_events")) d->supported_events = number(val);
    else if (!strcmp(key, "gpu_instance_id")) d->gi = (unsigned)number(val);
    else if (!strcmp(key, "compute_instance_id")) d->ci = (unsigned)number(val);
    else if (!strcmp(key, "profile_id")) d->profile_id = (unsigned)number(val);
    else if (!strcmp(key, "placement"))
        sscanf(val, "%u %u", &d->placement_start, &d->placement_size);
    else if (!strcmp(key, "utilization"))
        d->has_util = sscanf(val, "%u %u", &d->util_gpu, &d->util_mem) == 2;
    else if (!strcmp(key, "memory_used")) d->memory_used = number(val);
    else if (!strcmp(key, "temperature")) d->has_temp = 1, d->temp = (unsigned)number(val);
    else if (!strcmp(key, "power"))
        d->has_power = sscanf(val, "%u %u", &d->power_mw, &d->power_limit_mw) == 2;
    else if (!strcmp(key, "energy")) d->has_energy = 1, d->energy_mj = number(val);
    else if (!strcmp(key, "clocks"))
        d->has_clocks = sscanf(val, "%u %u", &d->clock_sm, &d->clock_mem) == 2;
    else if (!strcmp(key, "ecc"))
        d->has_ecc = sscanf(val, "%llu %llu", &d->ecc_corrected, &d->ecc_uncorrected) == 2;
    else if (!strcmp(key, "throttle")) d->has_throttle = 1, d->throttle = number(val);
    else if (!strcmp(key, "utilization_delay_ms")) d->util_delay_ms = (unsigned)number(val);
    else fprintf(stderr, "fake_nvml: unknown device key %s\n", key);
}

static gi_profile *profile_by_id(fake_dev *gpu, unsigned id, unsigned *index);
static int placement_id(const fake_dev *gpu, unsigned start, unsigned size, unsigned *id);
static void load_state(void);
static void write_mig_minors(void);

/* Returns 0, or an NVML error code for nvmlInit. */
static int load_profile(void) {
    const char *path = getenv("FAKE_NVML_PROFILE");
    g_ngpus = g_nmigs = 0;
    g_created = 0;
    g_init_error = 0;
    g_cuda_version = 0;
    g_driver_version[0] = '\0';
    if (!path || !*path) {
        fprintf(stderr, "fake_nvml: FAKE_NVML_PROFILE is not set\n");
        return NVML_ERROR_UNKNOWN;
    }
    FILE *f = fopen(path, "r");
    if (!f) {
        fprintf(stderr, "fake_nvml: cannot open profile %s\n", path);
        return NVML_ERROR_UNKNOWN;
    }
    char buf[512];
    fake_dev *cur = NULL;
    while (fgets(buf, sizeof buf, f)) {
        char *line = trim(buf);
        if (!*line || *line == '#') continue;
        if (!strcmp(line, "[gpu]")) {
            cur = g_ngpus < MAX_GPUS ? &g_gpus[g_ngpus] : NULL;
            if (cur) new_device(cur, 0, g_ngpus++);
            continue;
        }
        if (!strcmp(line, "[mig]")) {
            cur = (g_ngpus > 0 && g_nmigs < MAX_MIGS) ? &g_migs[g_nmigs] : NULL;
            if (cur) new_device(cur, 1, g_ngpus - 1), g_nmigs++;
            continue;
        }
        char *eq = strchr(line, '=');
        if (!eq) {
            fprintf(stderr, "fake_nvml: ignoring profile line: %s\n", line);
            continue;
        }
        *eq = '\0';
        char *key = trim(line), *val = trim(eq + 1);
        if (cur) set_key(cur, key, val);
        else if (!strcmp(key, "driver_version"))
            copy_text(g_driver_version, sizeof g_driver_version, val);
        else if (!strcmp(key, "cuda_driver_version")) g_cuda_version = (int)number(val);
        else if (!strcmp(key, "init_error")) g_init_error = (int)number(val);
        else fprintf(stderr, "fake_nvml: unknown key %s\n", key);
    }
    fclose(f);
    for (int i = 0; i < g_nmigs; i++) { /* a static instance's profile, by its id */
        fake_dev *m = &g_migs[i];
        g_cis[i].mig = m;
        unsigned index = 0, id = 0;
        if (profile_by_id(&g_gpus[m->gpu], m->profile_id, &index)) m->profile_index = index;
        if (!m->placement_size) continue;
        /* A placement fixes the GPU instance id, as on the real driver: a profile that says
         * otherwise describes no real GPU. */
        if (!placement_id(&g_gpus[m->gpu], m->placement_start, m->placement_size, &id)) {
            fprintf(stderr, "fake_nvml: %s: placement %u+%u is no span of memory slices\n",
                    m->uuid, m->placement_start, m->placement_size);
            return NVML_ERROR_UNKNOWN;
        }
        if (m->gi == FULL_INSTANCE) m->gi = id;
        if (m->gi != id) {
            fprintf(stderr, "fake_nvml: %s: gpu_instance_id %u, but placement %u+%u is GPU "
                    "instance %u on a real driver\n", m->uuid, m->gi, m->placement_start,
                    m->placement_size, id);
            return NVML_ERROR_UNKNOWN;
        }
    }
    load_state();
    write_mig_minors();
    return g_init_error;
}

/* ---- init / errors ------------------------------------------------------------ */

nvmlReturn_t nvmlInitWithFlags(unsigned flags) {
    (void)flags;
    pthread_mutex_lock(&g_lock);
    int ret = NVML_SUCCESS;
    if (g_refcount == 0) ret = load_profile();
    if (ret == NVML_SUCCESS) g_refcount++;
    pthread_mutex_unlock(&g_lock);
    return ret;
}
nvmlReturn_t nvmlInit_v2(void) { return nvmlInitWithFlags(0); }
nvmlReturn_t nvmlInit(void) { return nvmlInitWithFlags(0); }

nvmlReturn_t nvmlShutdown(void) {
    pthread_mutex_lock(&g_lock);
    int ret = g_refcount > 0 ? NVML_SUCCESS : NVML_ERROR_UNINITIALIZED;
    if (g_refcount > 0) g_refcount--;
    pthread_mutex_unlock(&g_lock);
    return ret;
}

const char *nvmlErrorString(nvmlReturn_t r) {
    switch (r) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_NO_PERMISSION: return "Insufficient Permissions";
    case NVML_ERROR_NOT_FOUND: return "Not Found";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    case NVML_ERROR_DRIVER_NOT_LOADED: return "Driver Not Loaded";
    case NVML_ERROR_TIMEOUT: return "Timeout";
    case NVML_ERROR_GPU_IS_LOST: return "GPU is lost";
    case NVML_ERROR_IN_USE: return "In use by another client";
    case NVML_ERROR_INSUFFICIENT_RESOURCES: return "Insufficient resources";
    case NVML_ERROR_LIB_RM_VERSION_MISMATCH: return "RM has detected an NVML/RM version mismatch.";
    case NVML_ERROR_ARGUMENT_VERSION_MISMATCH: return "Argument version mismatch";
    default: return "Unknown Error";
    }
}

/* ---- helpers ---------------------------------------------------------------- */

static fake_dev *as_dev(void *h) {
    fake_dev *d = h;
    if (d >= g_gpus && d < g_gpus + g_ngpus) return d;
    if (d >= g_migs && d < g_migs + g_nmigs && !d->dead) return d;
    return NULL;
}

/* Common checks for a device call: initialised, a valid handle, a GPU that answers. */
static nvmlReturn_t check(void *h, fake_dev **out) {
    if (g_refcount == 0) return NVML_ERROR_UNINITIALIZED;
    fake_dev *d = as_dev(h);
    if (!d) return NVML_ERROR_INVALID_ARGUMENT;
    fake_dev *gpu = &g_gpus[d->gpu];
    if (gpu->lost) return NVML_ERROR_GPU_IS_LOST;
    if (gpu->failing) return NVML_ERROR_UNKNOWN;
    *out = d;
    return NVML_SUCCESS;
}

#define CHECK(h, d)                                  \
    fake_dev *d;                                     \
    do {                                             \
        nvmlReturn_t r_ = check((h), &d);            \
        if (r_ != NVML_SUCCESS) return r_;           \
    } while (0)

static nvmlReturn_t copy_out(char *dst, unsigned len, const char *src) {
    if (!dst) return NVML_ERROR_INVALID_ARGUMENT;
    if (strlen(src) + 1 > len) return NVML_ERROR_INSUFFICIENT_SIZE;
    strcpy(dst, src);
    return NVML_SUCCESS;
}

/* ---- system ------------------------------------------------------------------ */

nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned len) {
    if (g_refcount == 0) return NVML_ERROR_UNINITIALIZED;
    return copy_out(version, len, g_driver_version);
}
nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *v) {
    if (g_refcount == 0) return NVML_ERROR_UNINITIALIZED;
    *v = g_cuda_version;
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *v) { return nvmlSystemGetCudaDriverVersion(v); }

/* ---- device enumeration ------------------------------------------------------- */

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned *count) {
    if (g_refcount == 0) return NVML_ERROR_UNINITIALIZED;
    *count = (unsigned)g_ngpus;
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetCount(unsigned *count) { return nvmlDeviceGetCount_v2(count); }

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned index, void **handle) {
    if (g_refcount == 0) return NVML_ERROR_UNINITIALIZED;
    if (index >= (unsigned)g_ngpus) return NVML_ERROR_INVALID_ARGUMENT;
    *handle = &g_gpus[index];
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned index, void **handle) {
    return nvmlDeviceGetHandleByIndex_v2(index, handle);
}

nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, void **handle) {
    if (g_refcount == 0) return NVML_ERROR_UNINITIALIZED;
    for (int i = 0; i < g_ngpus; i++) {
        if (!strcmp(g_gpus[i].uuid, uuid)) {
            if (g_gpus[i].lost) return NVML_ERROR_GPU_IS_LOST;
            *handle = &g_gpus[i];
            return NVML_SUCCESS;
        }
    }
    return NVML_ERROR_NOT_FOUND;
}

/* ---- device properties ---------------------------------------------------------- */

nvmlReturn_t nvmlDeviceGetMinorNumber(void *h, unsigned *minor) {
    CHECK(h, d);
    if (d->is_mig) return NVML_ERROR_NOT_SUPPORTED;
    *minor = d->minor;
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetUUID(void *h, char *uuid, unsigned len) {
    CHECK(h, d);
    return copy_out(uuid, len, d->uuid);
}
nvmlReturn_t nvmlDeviceGetName(void *h, char *name, unsigned len) {
    CHECK(h, d);
    return copy_out(name, len, d->name);
}
nvmlReturn_t nvmlDeviceGetBrand(void *h, int *brand) {
    CHECK(h, d);
    *brand = (int)g_gpus[d->gpu].brand;
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetArchitecture(void *h, unsigned *arch) {
    CHECK(h, d);
    *arch = g_gpus[d->gpu].arch;
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetCudaComputeCapability(void *h, int *major, int *minor) {
    CHECK(h, d);
    *major = (int)g_gpus[d->gpu].cc_major;
    *minor = (int)g_gpus[d->gpu].cc_minor;
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetMemoryInfo(void *h, nvmlMemory_t *m) {
    CHECK(h, d);
    m->total = d->memory;
    m->used = d->memory_used ? d->memory_used : d->memory / 100;
    m->free = d->memory - m->used;
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(void *h, nvmlMemory_v2_t *m) {
    CHECK(h, d);
    if (m->version != 0x02000028u) return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    m->total = d->memory;
    m->reserved = d->memory / 200;
    m->used = d->memory / 100;
    m->free = d->memory - m->used - m->reserved;
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetPciInfo_v3(void *h, nvmlPciInfo_t *p) {
    CHECK(h, d);
    fake_dev *gpu = &g_gpus[d->gpu];
    memset(p, 0, sizeof(*p));
    /* busIdLegacy is the short form NVML used before v9 ("0000:1B:00.0"). */
    snprintf(p->busIdLegacy, sizeof p->busIdLegacy, "%04X:%02X:%02X.%X", gpu->domain & 0xffff,
             gpu->bus, gpu->device, gpu->function);
    copy_text(p->busId, sizeof p->busId, gpu->bus_id);
    p->domain = gpu->domain;
    p->bus = gpu->bus;
    p->device = gpu->device;
    p->pciDeviceId = gpu->pci_device_id;
    p->pciSubSystemId = gpu->pci_subsystem_id;
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetPciInfo_v2(void *h, nvmlPciInfo_t *p) { return nvmlDeviceGetPciInfo_v3(h, p); }
nvmlReturn_t nvmlDeviceGetPciInfo(void *h, nvmlPciInfo_t *p) { return nvmlDeviceGetPciInfo_v3(h, p); }

static nvmlReturn_t link_value(void *h, int which, unsigned *out) {
    CHECK(h, d);
    if (d->is_mig || d->link[which] == 0) return NVML_ERROR_NOT_SUPPORTED;
    *out = d->link[which];
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetCurrPcieLinkGeneration(void *h, unsigned *v) { return link_value(h, 0, v); }
nvmlReturn_t nvmlDeviceGetCurrPcieLinkWidth(void *h, unsigned *v) { return link_value(h, 1, v); }
nvmlReturn_t nvmlDeviceGetMaxPcieLinkGeneration(void *h, unsigned *v) { return link_value(h, 2, v); }
nvmlReturn_t nvmlDeviceGetMaxPcieLinkWidth(void *h, unsigned *v) { return link_value(h, 3, v); }

/* ---- telemetry -------------------------------------------------------------------- */

static void log_call(const char *what, int gpu) {
    const char *path = getenv("FAKE_NVML_CALL_LOG");
    if (!path || !*path) return;
    FILE *f = fopen(path, "a");
    if (!f) return;
    fprintf(f, "%s %d\n", what, gpu);
    fclose(f);
}

#define TELEMETRY(h, d, flag)                                                 \
    CHECK(h, d);                                                              \
    if (d->is_mig || !d->flag) return NVML_ERROR_NOT_SUPPORTED

nvmlReturn_t nvmlDeviceGetUtilizationRates(void *h, nvmlUtilization_t *u) {
    CHECK(h, d);
    log_call("utilization", d->gpu);
    unsigned delay = d->util_delay_ms;
    if (delay) {
        struct timespec nap = {delay / 1000, (long)(delay % 1000) * 1000000L};
        nanosleep(&nap, NULL);
        log_call("utilization-done", d->gpu);
    }
    if (d->is_mig || !d->has_util) return NVML_ERROR_NOT_SUPPORTED;
    u->gpu = d->util_gpu;
    u->memory = d->util_mem;
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetTemperature(void *h, int sensor, unsigned *temp) {
    TELEMETRY(h, d, has_temp);
    if (sensor != 0) return NVML_ERROR_INVALID_ARGUMENT;
    *temp = d->temp;
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetPowerUsage(void *h, unsigned *mw) {
    TELEMETRY(h, d, has_power);
    *mw = d->power_mw;
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetEnforcedPowerLimit(void *h, unsigned *mw) {
    TELEMETRY(h, d, has_power);
    *mw = d->power_limit_mw;
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetTotalEnergyConsumption(void *h, unsigned long long *mj) {
    TELEMETRY(h, d, has_energy);
    pthread_mutex_lock(&g_lock);
    d->energy_mj += 1000;
    *mj = d->energy_mj;
    pthread_mutex_unlock(&g_lock);
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetClockInfo(void *h, int type, unsigned *mhz) {
    TELEMETRY(h, d, has_clocks);
    if (type == 1) *mhz = d->clock_sm;
    else if (type == 2) *mhz = d->clock_mem;
    else return NVML_ERROR_NOT_SUPPORTED;
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetTotalEccErrors(void *h, int error_type, int counter_type,
                                         unsigned long long *count) {
    TELEMETRY(h, d, has_ecc);
    if (counter_type != 0) return NVML_ERROR_NOT_SUPPORTED; /* only volatile counters */
    *count = error_type == 0 ? d->ecc_corrected : d->ecc_uncorrected;
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetCurrentClocksEventReasons(void *h, unsigned long long *reasons) {
    TELEMETRY(h, d, has_throttle);
    *reasons = d->throttle;
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetCurrentClocksThrottleReasons(void *h, unsigned long long *reasons) {
    return nvmlDeviceGetCurrentClocksEventReasons(h, reasons);
}

/* ---- MIG ------------------------------------------------------------------------ */

nvmlReturn_t nvmlDeviceGetMigMode(void *h, unsigned *current, unsigned *pending) {
    CHECK(h, d);
    if (d->is_mig || d->mig_mode < 0) return NVML_ERROR_NOT_SUPPORTED;
    *current = *pending = (unsigned)d->mig_mode;
    return NVML_SUCCESS;
}
/* nvml.h: "Returns zero if MIG is not supported or enabled" (and NVML_SUCCESS). */
nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(void *h, unsigned *count) {
    CHECK(h, d);
    if (d->is_mig || !count) return NVML_ERROR_INVALID_ARGUMENT;
    *count = d->mig_mode == 1 ? MAX_MIG_PER_GPU : 0;
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(void *h, unsigned index, void **mig) {
    CHECK(h, d);
    if (d->is_mig) return NVML_ERROR_INVALID_ARGUMENT;
    if (index >= MAX_MIG_PER_GPU) return NVML_ERROR_INVALID_ARGUMENT;
    unsigned seen = 0;
    for (int i = 0; i < g_nmigs; i++) {
        if (g_migs[i].gpu != d->gpu || g_migs[i].dead || !g_migs[i].has_ci) continue;
        if (seen++ == index) {
            *mig = &g_migs[i];
            return NVML_SUCCESS;
        }
    }
    return NVML_ERROR_NOT_FOUND;
}
nvmlReturn_t nvmlDeviceIsMigDeviceHandle(void *h, unsigned *is_mig) {
    CHECK(h, d);
    *is_mig = (unsigned)d->is_mig;
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetDeviceHandleFromMigDeviceHandle(void *h, void **parent) {
    CHECK(h, d);
    if (!d->is_mig) return NVML_ERROR_INVALID_ARGUMENT;
    *parent = &g_gpus[d->gpu];
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetGpuInstanceId(void *h, unsigned *id) {
    CHECK(h, d);
    if (!d->is_mig) return NVML_ERROR_INVALID_ARGUMENT;
    *id = d->gi;
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetComputeInstanceId(void *h, unsigned *id) {
    CHECK(h, d);
    if (!d->is_mig) return NVML_ERROR_INVALID_ARGUMENT;
    *id = d->ci;
    return NVML_SUCCESS;
}
/* A GPU instance handle is the first MIG device of that instance (opaque to callers). */
nvmlReturn_t nvmlDeviceGetGpuInstanceById(void *h, unsigned id, void **gi) {
    CHECK(h, d);
    if (d->is_mig) return NVML_ERROR_INVALID_ARGUMENT;
    for (int i = 0; i < g_nmigs; i++) {
        if (g_migs[i].gpu == d->gpu && g_migs[i].gi == id && !g_migs[i].dead) {
            *gi = &g_migs[i];
            return NVML_SUCCESS;
        }
    }
    return NVML_ERROR_NOT_FOUND;
}
nvmlReturn_t nvmlGpuInstanceGetInfo(void *gi, nvmlGpuInstanceInfo_t *info) {
    CHECK(gi, d);
    if (!d->is_mig) return NVML_ERROR_INVALID_ARGUMENT;
    info->device = &g_gpus[d->gpu];
    info->id = d->gi;
    info->profileId = d->profile_id;
    info->start = d->placement_start;
    info->size = d->placement_size;
    return NVML_SUCCESS;
}

/* ---- MIG instances made and destroyed through the API ------------------------------
 * The real rules: only a listed placement of a listed profile; no overlap with any GPU
 * instance of the GPU (static ones included) and at most instanceCount of a profile:
 * NVML_ERROR_INSUFFICIENT_RESOURCES; a GPU instance with a compute instance cannot be
 * destroyed: NVML_ERROR_IN_USE. One full-size compute instance per GPU instance (all the
 * plugin makes; smaller ones answer NOT_SUPPORTED here). Capability files appear under
 * FAKE_NVML_CAPS_ROOT (a fake /proc/driver/nvidia/capabilities) as the driver's do; with
 * FAKE_NVML_MIG_STATE the instances outlive the process, as real ones do. */

typedef struct {
    void *device, *gpuInstance;
    unsigned id, profileId;
    unsigned start, size;
} nvmlComputeInstanceInfo_t;
typedef struct {
    unsigned version, id, sliceCount, instanceCount, multiprocessorCount, sharedCopyEngineCount,
        sharedDecoderCount, sharedEncoderCount, sharedJpegCount, sharedOfaCount;
    char name[96];
} nvmlComputeInstanceProfileInfo_v2_t;

static const unsigned CI_SLICES[] = {1, 2, 3, 4, 7, 8, 6}; /* NVML_COMPUTE_INSTANCE_PROFILE_* */

/* Whether compute instance profile `ci` spans the whole of a GPU instance of profile p:
 * the only compute instance the stand-in makes. */
static int ci_spans(const gi_profile *p, unsigned ci) {
    return ci < sizeof CI_SLICES / sizeof CI_SLICES[0] && CI_SLICES[ci] == p->slices;
}

/* /proc/driver/nvidia-caps/mig-minors: gpuG/giI/access is 3 + 135 G + 9 I, its ciC one more
 * plus C (config 1, monitor 2; 15 GPU instances of 8 compute instances per GPU). */
static unsigned gi_access_minor(unsigned gpu_minor, unsigned gi) { return 3 + gpu_minor * 135 + gi * 9; }

static void make_dirs(char *path) {
    for (char *p = path + 1; *p; p++) {
        if (*p != '/') continue;
        *p = '\0';
        mkdir(path, 0755);
        *p = '/';
    }
    mkdir(path, 0755);
}

static void write_file(const char *path, const char *text) {
    char tmp[600];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    if (!f) return;
    fputs(text, f);
    fclose(f);
    rename(tmp, path);
}

/* FAKE_NVML_MIG_MINORS names a fake /proc/driver/nvidia-caps/mig-minors, written at every
 * first nvmlInit: like the driver's, it lists every possible access file (config, monitor,
 * then 15 GPU instances of 8 compute instances for each GPU minor up to the highest one in
 * the profile), not only those of instances that exist. */
static void write_mig_minors(void) {
    const char *path = getenv("FAKE_NVML_MIG_MINORS");
    if (!path || !*path) return;
    unsigned top = 0;
    for (int i = 0; i < g_ngpus; i++)
        if (g_gpus[i].minor > top) top = g_gpus[i].minor;
    char tmp[600];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    if (!f) return;
    fputs("config 1\nmonitor 2\n", f);
    for (unsigned g = 0; g <= top; g++) {
        for (unsigned gi = 0; gi < 15; gi++) {
            unsigned minor = gi_access_minor(g, gi);
            fprintf(f, "gpu%u/gi%u/access %u\n", g, gi, minor);
            for (unsigned ci = 0; ci < 8; ci++)
                fprintf(f, "gpu%u/gi%u/ci%u/access %u\n", g, gi, ci, minor + 1 + ci);
        }
    }
    fclose(f);
    rename(tmp, path);
}

static void gi_dir(const fake_dev *m, char *out, size_t n) {
    snprintf(out, n, "%s/gpu%u/mig/gi%u", getenv("FAKE_NVML_CAPS_ROOT"),
             g_gpus[m->gpu].minor, m->gi);
}

/* The three lines nv_cap_procfs_read prints (open-gpu-kernel-modules,
 * kernel-open/nvidia/nv-caps.c); 292 is 0444, the mode of MIG GI/CI access files. */
static void caps_write(const fake_dev *m) {
    const char *root = getenv("FAKE_NVML_CAPS_ROOT");
    if (!root || !*root) return;
    char dir[512], path[600], text[80];
    unsigned minor = gi_access_minor(g_gpus[m->gpu].minor, m->gi);
    gi_dir(m, dir, sizeof dir);
    make_dirs(dir);
    snprintf(path, sizeof path, "%s/access", dir);
    snprintf(text, sizeof text, "DeviceFileMinor: %u\nDeviceFileMode: 292\nDeviceFileModify: 1\n", minor);
    write_file(path, text);
    if (!m->has_ci) return;
    snprintf(dir + strlen(dir), sizeof dir - strlen(dir), "/ci%u", m->ci);
    make_dirs(dir);
    snprintf(path, sizeof path, "%s/access", dir);
    snprintf(text, sizeof text, "DeviceFileMinor: %u\nDeviceFileMode: 292\nDeviceFileModify: 1\n", minor + 1 + m->ci);
    write_file(path, text);
}

static void caps_remove(const fake_dev *m, int whole_gi) {
    const char *root = getenv("FAKE_NVML_CAPS_ROOT");
    if (!root || !*root) return;
    char dir[512], path[600];
    gi_dir(m, dir, sizeof dir);
    snprintf(path, sizeof path, "%s/ci%u/access", dir, m->ci);
    unlink(path);
    snprintf(path, sizeof path, "%s/ci%u", dir, m->ci);
    rmdir(path);
    if (!whole_gi) return;
    snprintf(path, sizeof path, "%s/access", dir);
    unlink(path);
    rmdir(dir);
}

static void save_state(void) {
    const char *path = getenv("FAKE_NVML_MIG_STATE");
    if (!path || !*path) return;
    char text[8192];
    size_t used = (size_t)snprintf(text, sizeof text, "created %u\n", g_created);
    for (int i = 0; i < g_nmigs && used < sizeof text; i++) {
        fake_dev *m = &g_migs[i];
        if (!m->dynamic || m->dead) continue;
        used += (size_t)snprintf(text + used, sizeof text - used, "gi %d %u %u %u %u %d %s\n",
                                 m->gpu, m->gi, m->profile_index, m->placement_start,
                                 m->placement_size, m->has_ci, m->uuid);
    }
    write_file(path, text);
}

static gi_profile *profile_by_id(fake_dev *gpu, unsigned id, unsigned *index) {
    for (unsigned i = 0; i < GI_PROFILE_COUNT; i++) {
        if (gpu->profiles[i].present && gpu->profiles[i].id == id) {
            if (index) *index = i;
            return &gpu->profiles[i];
        }
    }
    return NULL;
}

static void name_instance(fake_dev *m) {
    fake_dev *gpu = &g_gpus[m->gpu];
    gi_profile *p = &gpu->profiles[m->profile_index];
    int me = m->profile_index == 7 || m->profile_index == 8; /* the *_SLICE_REV1 profiles */
    if (p->name[0])
        snprintf(m->name, sizeof m->name, "%s MIG %s", gpu->name, p->name);
    else
        snprintf(m->name, sizeof m->name, "%s MIG %ug.%llugb%s", gpu->name, p->slices,
                 (p->memory_mib + 1023) / 1024, me ? "+me" : "");
    m->memory = p->memory_mib * 1024ULL * 1024ULL;
}

static fake_dev *add_instance(int gpu, unsigned id, unsigned index, unsigned start, unsigned size) {
    int slot = 0; /* a destroyed instance's slot first: the table does not grow without end */
    while (slot < g_nmigs && !g_migs[slot].dead) slot++;
    if (slot >= MAX_MIGS) return NULL;
    if (slot == g_nmigs) g_nmigs++;
    fake_dev *m = &g_migs[slot];
    new_device(m, 1, gpu);
    g_cis[slot].mig = m;
    m->dynamic = 1;
    m->has_ci = 0;
    m->gi = id;
    m->ci = FULL_INSTANCE;
    m->profile_index = index;
    m->profile_id = g_gpus[gpu].profiles[index].id;
    m->placement_start = start;
    m->placement_size = size;
    name_instance(m);
    return m;
}

static void load_state(void) {
    const char *path = getenv("FAKE_NVML_MIG_STATE");
    FILE *f = path && *path ? fopen(path, "r") : NULL;
    if (!f) return;
    char line[256], uuid[TEXT];
    int gpu, has_ci;
    unsigned id, index, start, size;
    while (fgets(line, sizeof line, f)) {
        if (sscanf(line, "created %u", &g_created) == 1) continue;
        if (sscanf(line, "gi %d %u %u %u %u %d %95s", &gpu, &id, &index, &start, &size, &has_ci,
                   uuid) != 7 || gpu < 0 || gpu >= g_ngpus || index >= GI_PROFILE_COUNT)
            continue;
        fake_dev *m = add_instance(gpu, id, index, start, size);
        if (!m) break;
        m->has_ci = has_ci;
        if (has_ci) m->ci = 0;
        copy_text(m->uuid, sizeof m->uuid, uuid);
    }
    fclose(f);
}

/* The GPU instance id the driver gives a placement: the partition's swizzId, which names
 * its span of memory slices (open-gpu-kernel-modules, kmigmgrSwizzIdToSpan_GA100 in
 * src/nvidia/src/kernel/gpu/mig_mgr/arch/ampere/kmigmgr_ga100.c, used for GA100, GH100 and
 * GB100): 0 the whole GPU, 1-2 its halves, 3-6 its quarters, 7-14 its eighths, each level
 * in slice order. So an id is a function of the placement, never of what else exists or
 * was made before: id = slices/size - 1 + start/size. Returns 0 for a placement that is
 * no such span. */
static unsigned memory_slices(const fake_dev *gpu) {
    unsigned top = 0;
    for (unsigned i = 0; i < GI_PROFILE_COUNT; i++) {
        const gi_profile *p = &gpu->profiles[i];
        for (unsigned k = 0; p->present && k < p->nplacements; k++)
            if (p->placements[k][0] + p->placements[k][1] > top)
                top = p->placements[k][0] + p->placements[k][1];
    }
    return top ? top : 8; /* no profile table: the 8 memory slices of A100/H100/H200 */
}

static int placement_id(const fake_dev *gpu, unsigned start, unsigned size, unsigned *id) {
    unsigned slices = memory_slices(gpu);
    if (size == 0 || slices % size || start % size || start + size > slices) return 0;
    unsigned parts = slices / size;
    if (parts & (parts - 1)) return 0; /* not a power of two: no level of the tree */
    *id = parts - 1 + start / size;
    return 1;
}

static int in_use_range(int gpu, unsigned start, unsigned size) {
    for (int i = 0; i < g_nmigs; i++) {
        fake_dev *m = &g_migs[i];
        if (m->gpu != gpu || m->dead) continue;
        if (start < m->placement_start + m->placement_size && m->placement_start < start + size)
            return 1;
    }
    return 0;
}

static unsigned live_of(int gpu, unsigned profile_id) {
    unsigned n = 0;
    for (int i = 0; i < g_nmigs; i++)
        if (g_migs[i].gpu == gpu && !g_migs[i].dead && g_migs[i].profile_id == profile_id) n++;
    return n;
}

nvmlReturn_t nvmlDeviceCreateGpuInstanceWithPlacement(void *h, unsigned profile_id,
                                                      const nvmlGpuInstancePlacement_t *pl,
                                                      void **out) {
    CHECK(h, d);
    if (!pl || !out || d->is_mig) return NVML_ERROR_INVALID_ARGUMENT;
    if (d->mig_mode != 1) return NVML_ERROR_NOT_SUPPORTED;
    unsigned index;
    gi_profile *p = profile_by_id(d, profile_id, &index);
    if (!p) return NVML_ERROR_INVALID_ARGUMENT;
    int listed = 0;
    for (unsigned k = 0; k < p->nplacements; k++)
        listed |= p->placements[k][0] == pl->start && p->placements[k][1] == pl->size;
    if (!listed) return NVML_ERROR_INVALID_ARGUMENT;
    pthread_mutex_lock(&g_lock);
    nvmlReturn_t r = NVML_SUCCESS;
    if (in_use_range(d->gpu, pl->start, pl->size) || live_of(d->gpu, profile_id) >= p->instances) {
        r = NVML_ERROR_INSUFFICIENT_RESOURCES;
    } else {
        unsigned id = 0;
        placement_id(d, pl->start, pl->size, &id); /* a listed placement always has one */
        fake_dev *m = add_instance(d->gpu, id, index, pl->start, pl->size);
        if (!m) {
            r = NVML_ERROR_INSUFFICIENT_RESOURCES;
        } else {
            g_created++;
            snprintf(m->uuid, sizeof m->uuid, "MIG-%08x-%04x-5000-8000-%012x", 0xd1000000u + g_created,
                     (unsigned)d->gpu, m->gi);
            caps_write(m);
            save_state();
            *out = m;
        }
    }
    pthread_mutex_unlock(&g_lock);
    return r;
}

/* A GPU instance handle: a live MIG slot (static or made here). */
static fake_dev *as_gi(void *gi) {
    fake_dev *m = as_dev(gi);
    return m && m->is_mig ? m : NULL;
}

static fake_dev *as_ci(void *ci) {
    fake_ci *c = ci;
    if (c < g_cis || c >= g_cis + g_nmigs || !c->mig || c->mig->dead || !c->mig->has_ci)
        return NULL;
    return c->mig;
}

nvmlReturn_t nvmlGpuInstanceGetComputeInstanceProfileInfoV(void *gi, unsigned profile,
                                                           unsigned eng,
                                                           nvmlComputeInstanceProfileInfo_v2_t *info) {
    if (g_refcount == 0) return NVML_ERROR_UNINITIALIZED;
    fake_dev *m = as_gi(gi);
    if (!m || !info || eng != 0) return NVML_ERROR_INVALID_ARGUMENT;
    gi_profile *p = &g_gpus[m->gpu].profiles[m->profile_index];
    if (!ci_spans(p, profile)) return NVML_ERROR_NOT_SUPPORTED;
    unsigned version = info->version;
    memset(info, 0, sizeof(*info));
    info->version = version;
    info->id = profile;
    info->sliceCount = p->slices;
    info->instanceCount = 1;
    info->multiprocessorCount = p->sm;
    info->sharedCopyEngineCount = p->ce;
    info->sharedDecoderCount = p->dec;
    info->sharedEncoderCount = p->enc;
    info->sharedJpegCount = p->jpeg;
    info->sharedOfaCount = p->ofa;
    snprintf(info->name, sizeof info->name, "%uc", p->slices);
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlGpuInstanceGetComputeInstanceProfileInfo(void *gi, unsigned profile, unsigned eng,
                                                          void *info_v1) {
    nvmlComputeInstanceProfileInfo_v2_t v2 = {.version = 0x02000088u};
    nvmlReturn_t r = nvmlGpuInstanceGetComputeInstanceProfileInfoV(gi, profile, eng, &v2);
    if (r == NVML_SUCCESS) memcpy(info_v1, &v2.id, 9 * sizeof(unsigned));
    return r;
}

nvmlReturn_t nvmlGpuInstanceCreateComputeInstance(void *gi, unsigned profile_id, void **out) {
    if (g_refcount == 0) return NVML_ERROR_UNINITIALIZED;
    fake_dev *m = as_gi(gi);
    if (!m || !out) return NVML_ERROR_INVALID_ARGUMENT;
    gi_profile *p = &g_gpus[m->gpu].profiles[m->profile_index];
    if (!ci_spans(p, profile_id)) return NVML_ERROR_NOT_SUPPORTED;
    pthread_mutex_lock(&g_lock);
    nvmlReturn_t r = NVML_ERROR_INSUFFICIENT_RESOURCES;
    if (!m->has_ci) {
        m->has_ci = 1;
        m->ci = 0;
        caps_write(m);
        save_state();
        *out = &g_cis[m - g_migs];
        r = NVML_SUCCESS;
    }
    pthread_mutex_unlock(&g_lock);
    return r;
}

nvmlReturn_t nvmlComputeInstanceDestroy(void *ci) {
    if (g_refcount == 0) return NVML_ERROR_UNINITIALIZED;
    fake_dev *m = as_ci(ci);
    if (!m) return NVML_ERROR_INVALID_ARGUMENT;
    pthread_mutex_lock(&g_lock);
    caps_remove(m, 0);
    m->has_ci = 0;
    m->ci = FULL_INSTANCE;
    save_state();
    pthread_mutex_unlock(&g_lock);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlGpuInstanceDestroy(void *gi) {
    if (g_refcount == 0) return NVML_ERROR_UNINITIALIZED;
    fake_dev *m = as_gi(gi);
    if (!m) return NVML_ERROR_INVALID_ARGUMENT;
    if (m->has_ci) return NVML_ERROR_IN_USE;
    pthread_mutex_lock(&g_lock);
    caps_remove(m, 1);
    m->dead = 1;
    save_state();
    pthread_mutex_unlock(&g_lock);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetGpuInstances(void *h, unsigned profile_id, void **gis, unsigned *count) {
    CHECK(h, d);
    if (!count || d->is_mig) return NVML_ERROR_INVALID_ARGUMENT;
    if (d->mig_mode != 1) return NVML_ERROR_NOT_SUPPORTED;
    unsigned n = 0;
    for (int i = 0; i < g_nmigs; i++) {
        fake_dev *m = &g_migs[i];
        if (m->gpu != d->gpu || m->dead || m->profile_id != profile_id) continue;
        if (gis) gis[n] = m;
        n++;
    }
    *count = n;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlGpuInstanceGetComputeInstances(void *gi, unsigned profile_id, void **cis,
                                                unsigned *count) {
    if (g_refcount == 0) return NVML_ERROR_UNINITIALIZED;
    fake_dev *m = as_gi(gi);
    if (!m || !count) return NVML_ERROR_INVALID_ARGUMENT;
    gi_profile *p = &g_gpus[m->gpu].profiles[m->profile_index];
    int match = m->has_ci && ci_spans(p, profile_id);
    if (match && cis) cis[0] = &g_cis[m - g_migs];
    *count = match ? 1 : 0;
    return NVML_SUCCESS;
}

/* Without a placement the driver picks one: here the first listed placement that is free. */
nvmlReturn_t nvmlDeviceCreateGpuInstance(void *h, unsigned profile_id, void **out) {
    CHECK(h, d);
    if (!out || d->is_mig) return NVML_ERROR_INVALID_ARGUMENT;
    if (d->mig_mode != 1) return NVML_ERROR_NOT_SUPPORTED;
    gi_profile *p = profile_by_id(d, profile_id, NULL);
    if (!p) return NVML_ERROR_INVALID_ARGUMENT;
    for (unsigned k = 0; k < p->nplacements; k++) {
        nvmlGpuInstancePlacement_t pl = {p->placements[k][0], p->placements[k][1]};
        nvmlReturn_t r = nvmlDeviceCreateGpuInstanceWithPlacement(h, profile_id, &pl, out);
        if (r != NVML_ERROR_INSUFFICIENT_RESOURCES) return r;
    }
    return NVML_ERROR_INSUFFICIENT_RESOURCES;
}

/* The one full-size compute instance profile of a GPU instance, or -1. */
static int full_ci_profile(const fake_dev *m, unsigned profile_id) {
    const gi_profile *p = &g_gpus[m->gpu].profiles[m->profile_index];
    int ok = ci_spans(p, profile_id);
    return ok ? (int)p->slices : -1;
}

nvmlReturn_t nvmlGpuInstanceGetComputeInstanceById(void *gi, unsigned id, void **out) {
    if (g_refcount == 0) return NVML_ERROR_UNINITIALIZED;
    fake_dev *m = as_gi(gi);
    if (!m || !out) return NVML_ERROR_INVALID_ARGUMENT;
    if (!m->has_ci || m->ci != id) return NVML_ERROR_NOT_FOUND;
    *out = &g_cis[m - g_migs];
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlGpuInstanceGetComputeInstanceRemainingCapacity(void *gi, unsigned profile_id,
                                                                unsigned *count) {
    if (g_refcount == 0) return NVML_ERROR_UNINITIALIZED;
    fake_dev *m = as_gi(gi);
    if (!m || !count) return NVML_ERROR_INVALID_ARGUMENT;
    if (full_ci_profile(m, profile_id) < 0) return NVML_ERROR_NOT_SUPPORTED;
    *count = m->has_ci ? 0 : 1;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlGpuInstanceGetComputeInstancePossiblePlacements(
    void *gi, unsigned profile_id, nvmlGpuInstancePlacement_t *out, unsigned *count) {
    if (g_refcount == 0) return NVML_ERROR_UNINITIALIZED;
    fake_dev *m = as_gi(gi);
    if (!m || !count) return NVML_ERROR_INVALID_ARGUMENT;
    int slices = full_ci_profile(m, profile_id);
    if (slices < 0) return NVML_ERROR_NOT_SUPPORTED;
    if (out && *count < 1) {
        *count = 1;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    if (out) out[0].start = 0, out[0].size = (unsigned)slices;
    *count = 1;
    return NVML_SUCCESS;
}

/* nvmlComputeInstancePlacement_t has nvmlGpuInstancePlacement_t's layout. */
nvmlReturn_t nvmlGpuInstanceCreateComputeInstanceWithPlacement(
    void *gi, unsigned profile_id, const nvmlGpuInstancePlacement_t *pl, void **out) {
    if (g_refcount == 0) return NVML_ERROR_UNINITIALIZED;
    fake_dev *m = as_gi(gi);
    if (!m || !pl || !out) return NVML_ERROR_INVALID_ARGUMENT;
    int slices = full_ci_profile(m, profile_id);
    if (slices < 0) return NVML_ERROR_NOT_SUPPORTED;
    if (pl->start != 0 || pl->size != (unsigned)slices) return NVML_ERROR_INVALID_ARGUMENT;
    return nvmlGpuInstanceCreateComputeInstance(gi, profile_id, out);
}

nvmlReturn_t nvmlComputeInstanceGetInfo_v2(void *ci, nvmlComputeInstanceInfo_t *info) {
    if (g_refcount == 0) return NVML_ERROR_UNINITIALIZED;
    fake_dev *m = as_ci(ci);
    if (!m || !info) return NVML_ERROR_INVALID_ARGUMENT;
    gi_profile *p = &g_gpus[m->gpu].profiles[m->profile_index];
    info->device = &g_gpus[m->gpu];
    info->gpuInstance = m;
    info->id = m->ci;
    for (unsigned k = 0; k < sizeof CI_SLICES / sizeof CI_SLICES[0]; k++)
        if (CI_SLICES[k] == p->slices) info->profileId = k;
    info->start = 0;
    info->size = p->slices;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetGpuInstanceRemainingCapacity(void *h, unsigned profile_id, unsigned *count) {
    CHECK(h, d);
    if (!count || d->is_mig) return NVML_ERROR_INVALID_ARGUMENT;
    if (d->mig_mode != 1) return NVML_ERROR_NOT_SUPPORTED;
    gi_profile *p = profile_by_id(d, profile_id, NULL);
    if (!p) return NVML_ERROR_INVALID_ARGUMENT;
    /* Greedy over the listed placements, as a count of what could still be made. */
    unsigned n = 0, left = p->instances - live_of(d->gpu, profile_id);
    unsigned long long taken = 0;
    for (int i = 0; i < g_nmigs; i++) {
        fake_dev *m = &g_migs[i];
        if (m->gpu != d->gpu || m->dead) continue;
        for (unsigned s = m->placement_start; s < m->placement_start + m->placement_size; s++)
            taken |= 1ULL << s;
    }
    for (unsigned k = 0; k < p->nplacements && n < left; k++) {
        unsigned long long want = 0;
        for (unsigned s = p->placements[k][0]; s < p->placements[k][0] + p->placements[k][1]; s++)
            want |= 1ULL << s;
        if (!(want & taken)) n++, taken |= want;
    }
    *count = n;
    return NVML_SUCCESS;
}

/* Profiles are the physical GPU's; NVML takes the NVML_GPU_INSTANCE_PROFILE_* index. */
static nvmlReturn_t gi_profile_at(void *h, unsigned index, gi_profile **out) {
    CHECK(h, d);
    if (d->is_mig || d->mig_mode < 0) return NVML_ERROR_NOT_SUPPORTED;
    if (index >= GI_PROFILE_COUNT) return NVML_ERROR_INVALID_ARGUMENT;
    if (!d->profiles[index].present) return NVML_ERROR_NOT_SUPPORTED;
    *out = &d->profiles[index];
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetGpuInstanceProfileInfo(void *h, unsigned index,
                                                 nvmlGpuInstanceProfileInfo_t *info) {
    gi_profile *p;
    nvmlReturn_t r = gi_profile_at(h, index, &p);
    if (r != NVML_SUCCESS) return r;
    memset(info, 0, sizeof(*info));
    info->id = p->id;
    info->isP2pSupported = 0;
    info->sliceCount = p->slices;
    info->instanceCount = p->instances;
    info->multiprocessorCount = p->sm;
    info->copyEngineCount = p->ce;
    info->decoderCount = p->dec;
    info->encoderCount = p->enc;
    info->jpegCount = p->jpeg;
    info->ofaCount = p->ofa;
    info->memorySizeMB = p->memory_mib;
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetGpuInstanceProfileInfoV(void *h, unsigned index,
                                                  nvmlGpuInstanceProfileInfo_v2_t *info) {
    if (!info || info->version != 0x02000098u) return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    nvmlGpuInstanceProfileInfo_t v1;
    nvmlReturn_t r = nvmlDeviceGetGpuInstanceProfileInfo(h, index, &v1);
    if (r != NVML_SUCCESS) return r;
    info->id = v1.id;
    info->isP2pSupported = v1.isP2pSupported;
    info->sliceCount = v1.sliceCount;
    info->instanceCount = v1.instanceCount;
    info->multiprocessorCount = v1.multiprocessorCount;
    info->copyEngineCount = v1.copyEngineCount;
    info->decoderCount = v1.decoderCount;
    info->encoderCount = v1.encoderCount;
    info->jpegCount = v1.jpegCount;
    info->ofaCount = v1.ofaCount;
    info->memorySizeMB = v1.memorySizeMB;
    snprintf(info->name, sizeof info->name, "profile %u", index);
    return NVML_SUCCESS;
}
/* Takes the profile ID (nvmlGpuInstanceProfileInfo_t.id), not the index. With
 * placements NULL it only answers the count. */
nvmlReturn_t nvmlDeviceGetGpuInstancePossiblePlacements_v2(void *h, unsigned profile_id,
                                                           nvmlGpuInstancePlacement_t *out,
                                                           unsigned *count) {
    CHECK(h, d);
    if (!count) return NVML_ERROR_INVALID_ARGUMENT;
    if (d->is_mig || d->mig_mode < 0) return NVML_ERROR_NOT_SUPPORTED;
    for (int i = 0; i < GI_PROFILE_COUNT; i++) {
        gi_profile *p = &d->profiles[i];
        if (!p->present || p->id != profile_id) continue;
        if (!out) {
            *count = p->nplacements;
            return NVML_SUCCESS;
        }
        if (*count < p->nplacements) {
            *count = p->nplacements;
            return NVML_ERROR_INSUFFICIENT_SIZE;
        }
        for (unsigned k = 0; k < p->nplacements; k++) {
            out[k].start = p->placements[k][0];
            out[k].size = p->placements[k][1];
        }
        *count = p->nplacements;
        return NVML_SUCCESS;
    }
    return NVML_ERROR_INVALID_ARGUMENT;
}
nvmlReturn_t nvmlDeviceGetAddressingMode(void *h, nvmlDeviceAddressingMode_t *mode) {
    CHECK(h, d);
    if (!mode || mode->version != 0x1000008u) return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    fake_dev *gpu = &g_gpus[d->gpu];
    if (gpu->addressing_mode < 0) return NVML_ERROR_NOT_SUPPORTED;
    mode->value = (unsigned)gpu->addressing_mode;
    return NVML_SUCCESS;
}

/* ---- events --------------------------------------------------------------------- */

nvmlReturn_t nvmlEventSetCreate(fake_event_set **set) {
    if (g_refcount == 0) return NVML_ERROR_UNINITIALIZED;
    *set = calloc(1, sizeof(fake_event_set));
    return *set ? NVML_SUCCESS : NVML_ERROR_UNKNOWN;
}
nvmlReturn_t nvmlEventSetFree(fake_event_set *set) {
    free(set);
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetSupportedEventTypes(void *h, unsigned long long *types) {
    CHECK(h, d);
    if (d->is_mig) return NVML_ERROR_NOT_SUPPORTED;
    *types = d->supported_events;
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceRegisterEvents(void *h, unsigned long long types, fake_event_set *set) {
    CHECK(h, d);
    if (!set) return NVML_ERROR_INVALID_ARGUMENT;
    if (d->is_mig || (types & ~d->supported_events)) return NVML_ERROR_NOT_SUPPORTED;
    set->mask[d->gpu] |= types;
    return NVML_SUCCESS;
}

/* Interprets one event line. Returns NVML_SUCCESS with *data filled for an event,
 * NVML_ERROR_GPU_IS_LOST for "lost", or NVML_ERROR_NOT_FOUND when the line produced
 * no event (state change, unregistered type, junk). */
static nvmlReturn_t apply_line(fake_event_set *set, const char *line, nvmlEventData_t *data) {
    char verb[16] = "";
    int index = -1;
    unsigned long long code = 0;
    unsigned gi = FULL_INSTANCE, ci = FULL_INSTANCE;
    int n = sscanf(line, "%15s %d %llu %u %u", verb, &index, &code, &gi, &ci);
    if (n < 2 || index < 0 || index >= g_ngpus) {
        fprintf(stderr, "fake_nvml: ignoring event line: %s", line);
        return NVML_ERROR_NOT_FOUND;
    }
    fake_dev *gpu = &g_gpus[index];
    if (!strcmp(verb, "lost")) {
        gpu->lost = 1;
        return NVML_ERROR_GPU_IS_LOST;
    }
    if (!strcmp(verb, "fail")) {
        gpu->failing = 1;
        return NVML_ERROR_NOT_FOUND;
    }
    if (!strcmp(verb, "recover")) {
        gpu->lost = gpu->failing = 0;
        return NVML_ERROR_NOT_FOUND;
    }
    if (!strcmp(verb, "set")) {
        char key[64], val[128];
        if (sscanf(line, "%*s %*d %63s = %127[^\n]", key, val) == 2) {
            pthread_mutex_lock(&g_lock);
            set_key(gpu, key, val);
            pthread_mutex_unlock(&g_lock);
        } else {
            fprintf(stderr, "fake_nvml: bad set line: %s", line);
        }
        return NVML_ERROR_NOT_FOUND;
    }
    unsigned long long type = !strcmp(verb, "xid") ? EVENT_XID : !strcmp(verb, "ecc") ? EVENT_DBE : 0;
    if (!type || !(set->mask[index] & type)) return NVML_ERROR_NOT_FOUND;
    data->device = gpu;
    data->eventType = type;
    data->eventData = type == EVENT_XID ? code : 0;
    data->gpuInstanceId = gi;
    data->computeInstanceId = ci;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlEventSetWait_v2(fake_event_set *set, nvmlEventData_t *data, unsigned timeout_ms) {
    if (g_refcount == 0) return NVML_ERROR_UNINITIALIZED;
    if (!set || !data) return NVML_ERROR_INVALID_ARGUMENT;
    const char *path = getenv("FAKE_NVML_EVENTS");
    struct timespec start, now, nap = {0, 5 * 1000 * 1000};
    log_call("wait", -1);
    clock_gettime(CLOCK_MONOTONIC, &start);
    for (;;) {
        FILE *f = path && *path ? fopen(path, "r") : NULL;
        if (f) {
            char line[256];
            nvmlReturn_t ret = NVML_ERROR_NOT_FOUND;
            if (fseek(f, set->offset, SEEK_SET) == 0) {
                while (ret == NVML_ERROR_NOT_FOUND && fgets(line, sizeof line, f)) {
                    size_t len = strlen(line);
                    if (len == 0 || line[len - 1] != '\n') break; /* half-written line */
                    set->offset += (long)len;
                    ret = apply_line(set, line, data);
                }
            }
            fclose(f);
            if (ret != NVML_ERROR_NOT_FOUND) return ret;
        }
        for (int i = 0; i < g_ngpus; i++) /* pending lines first: "recover" clears it */
            if (set->mask[i] && g_gpus[i].lost) return NVML_ERROR_GPU_IS_LOST;
        clock_gettime(CLOCK_MONOTONIC, &now);
        long elapsed_ms = (now.tv_sec - start.tv_sec) * 1000 + (now.tv_nsec - start.tv_nsec) / 1000000;
        if (elapsed_ms >= (long)timeout_ms) return NVML_ERROR_TIMEOUT;
        nanosleep(&nap, NULL);
    }
}
