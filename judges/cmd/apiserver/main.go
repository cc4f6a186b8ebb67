// Command apiserver runs the real kube-apiserver with an embedded etcd on 127.0.0.1, for
// the plugin's tests. It owns one directory: etcd's data, the serving certificate, the
// service-account key and an admin token. When /readyz answers ok it writes a JSON file
// (url, ca_file, token) and prints one line; SIGTERM stops the API server, then etcd.
//
// Flags after "--" go to kube-apiserver unchanged; --feature-gates, --emulated-version and
// --runtime-config are named here because the tests use them most.
package main

import (
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"flag"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
	"k8s.io/client-go/util/cert"
	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register"
	"k8s.io/kubernetes/cmd/kube-apiserver/app"
)

type readyInfo struct {
	URL     string  `json:"url"`
	CAFile  string  `json:"ca_file"`
	Token   string  `json:"token"`
	Etcd    string  `json:"etcd"`
	PID     int     `json:"pid"`
	Seconds float64 `json:"seconds"`
}

func main() {
	dir := flag.String("dir", "", "directory this server owns (etcd data, certificates, keys)")
	readyFile := flag.String("ready-file", "", "where to write the JSON once /readyz is ok")
	gates := flag.String("feature-gates", "", "kube-apiserver --feature-gates")
	emulated := flag.String("emulated-version", "", "kube-apiserver --emulated-version (e.g. 1.34)")
	runtimeConfig := flag.String("runtime-config", "", "kube-apiserver --runtime-config (e.g. resource.k8s.io/v1beta2=true)")
	var servingIPs []net.IP
	flag.Func("serving-ip", "one more IP address the serving certificate is valid for (repeatable; 127.0.0.1 always is)", func(v string) error {
		ip := net.ParseIP(v)
		if ip == nil {
			return fmt.Errorf("not an IP address: %q", v)
		}
		servingIPs = append(servingIPs, ip)
		return nil
	})
	flag.Parse()
	if *dir == "" || *readyFile == "" {
		fmt.Fprintln(os.Stderr, "apiserver: --dir and --ready-file are required")
		os.Exit(2)
	}
	start := time.Now()
	go dieWithParent()
	if err := run(*dir, *readyFile, *gates, *emulated, *runtimeConfig, servingIPs, flag.Args(), start); err != nil {
		fmt.Fprintln(os.Stderr, "apiserver:", err)
		os.Exit(1)
	}
}

func run(dir, readyFile, gates, emulated, runtimeConfig string, servingIPs []net.IP, extra []string, start time.Time) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	files, err := writeCredentials(dir, servingIPs)
	if err != nil {
		return fmt.Errorf("credentials: %w", err)
	}
	etcd, etcdURL, err := startEtcd(filepath.Join(dir, "etcd"))
	if err != nil {
		return fmt.Errorf("etcd: %w", err)
	}
	defer etcd.Close()

	port, err := freePort()
	if err != nil {
		return err
	}
	args := []string{
		"--etcd-servers=" + etcdURL,
		"--bind-address=127.0.0.1",
		"--advertise-address=127.0.0.1",
		"--secure-port=" + strconv.Itoa(port),
		"--cert-dir=" + filepath.Join(dir, "certs"),
		"--tls-cert-file=" + files.servingCert,
		"--tls-private-key-file=" + files.servingKey,
		"--token-auth-file=" + files.tokens,
		"--authorization-mode=Node,RBAC",
		"--enable-admission-plugins=NodeRestriction,ValidatingAdmissionPolicy",
		"--service-account-issuer=https://kubernetes.default.svc",
		"--api-audiences=https://kubernetes.default.svc",
		"--service-account-key-file=" + files.saKey,
		"--service-account-signing-key-file=" + files.saKey,
		"--service-cluster-ip-range=10.0.0.0/16",
		"--endpoint-reconciler-type=none",
		"--profiling=false",
	}
	if gates != "" {
		args = append(args, "--feature-gates="+gates)
	}
	if emulated != "" {
		args = append(args, "--emulated-version="+emulated)
	}
	if runtimeConfig != "" {
		args = append(args, "--runtime-config="+runtimeConfig)
	}
	args = append(args, extra...)

	serverURL := "https://127.0.0.1:" + strconv.Itoa(port)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		if err := waitReady(ctx, serverURL, files); err != nil {
			return
		}
		info := readyInfo{
			URL: serverURL, CAFile: files.ca, Token: files.adminToken, Etcd: etcdURL,
			PID: os.Getpid(), Seconds: time.Since(start).Seconds(),
		}
		if err := writeJSON(readyFile, info); err != nil {
			fmt.Fprintln(os.Stderr, "apiserver: ready file:", err)
			return
		}
		fmt.Printf("ready %s in %.1fs\n", serverURL, info.Seconds)
	}()

	// The command installs its own SIGTERM/SIGINT handler: Run returns after a graceful
	// shutdown, and etcd closes after it (deferred).
	command := app.NewAPIServerCommand()
	command.SetArgs(args)
	if code := cli.Run(command); code != 0 {
		return fmt.Errorf("kube-apiserver exited with code %d", code)
	}
	return nil
}

type credentialFiles struct {
	ca, servingCert, servingKey, saKey, tokens, adminToken string
}

// writeCredentials makes a self-signed serving certificate for 127.0.0.1/localhost (and
// the extra IPs: the real node's pods reach the server through its service IP), a
// service-account signing key and a static admin token in system:masters.
func writeCredentials(dir string, extraIPs []net.IP) (credentialFiles, error) {
	f := credentialFiles{
		ca:          filepath.Join(dir, "ca.crt"),
		servingCert: filepath.Join(dir, "serving.crt"),
		servingKey:  filepath.Join(dir, "serving.key"),
		saKey:       filepath.Join(dir, "sa.key"),
		tokens:      filepath.Join(dir, "tokens.csv"),
	}
	chain, key, err := cert.GenerateSelfSignedCertKey("localhost", append([]net.IP{net.ParseIP("127.0.0.1")}, extraIPs...), []string{"localhost"})
	if err != nil {
		return f, err
	}
	// The chain is the serving certificate followed by the CA that signed it.
	var blocks []*pem.Block
	for rest := chain; ; {
		var b *pem.Block
		b, rest = pem.Decode(rest)
		if b == nil {
			break
		}
		blocks = append(blocks, b)
	}
	if len(blocks) < 2 {
		return f, fmt.Errorf("self-signed chain has %d certificates, want 2", len(blocks))
	}
	saKey, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return f, err
	}
	saPEM := pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(saKey)})
	raw := make([]byte, 24)
	if _, err := rand.Read(raw); err != nil {
		return f, err
	}
	f.adminToken = hex.EncodeToString(raw)
	writes := map[string][]byte{
		f.ca:          pem.EncodeToMemory(blocks[len(blocks)-1]),
		f.servingCert: chain,
		f.servingKey:  key,
		f.saKey:       saPEM,
		f.tokens:      []byte(f.adminToken + ",judge-admin,judge-admin-uid,system:masters\n"),
	}
	for path, data := range writes {
		if err := os.WriteFile(path, data, 0o600); err != nil {
			return f, err
		}
	}
	return f, nil
}

func startEtcd(dataDir string) (*embed.Etcd, string, error) {
	clientPort, err := freePort()
	if err != nil {
		return nil, "", err
	}
	peerPort, err := freePort()
	if err != nil {
		return nil, "", err
	}
	clientURL := url.URL{Scheme: "http", Host: "127.0.0.1:" + strconv.Itoa(clientPort)}
	peerURL := url.URL{Scheme: "http", Host: "127.0.0.1:" + strconv.Itoa(peerPort)}
	cfg := embed.NewConfig()
	cfg.Name = "judge"
	cfg.Dir = dataDir
	cfg.ListenClientUrls = []url.URL{clientURL}
	cfg.AdvertiseClientUrls = []url.URL{clientURL}
	cfg.ListenPeerUrls = []url.URL{peerURL}
	cfg.AdvertisePeerUrls = []url.URL{peerURL}
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
	cfg.LogLevel = "error"
	// A test server's data dies with it: fsync buys nothing and costs seconds on a busy disk.
	cfg.UnsafeNoFsync = true
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return nil, "", err
	}
	select {
	case <-e.Server.ReadyNotify():
	case <-time.After(60 * time.Second):
		e.Close()
		return nil, "", fmt.Errorf("not ready after 60s")
	}
	return e, clientURL.String(), nil
}

func waitReady(ctx context.Context, serverURL string, f credentialFiles) error {
	caPEM, err := os.ReadFile(f.ca)
	if err != nil {
		return err
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caPEM)
	client := &http.Client{
		Timeout:   5 * time.Second,
		Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}},
	}
	for {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, serverURL+"/readyz", nil)
		req.Header.Set("Authorization", "Bearer "+f.adminToken)
		resp, err := client.Do(req)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func writeJSON(path string, v any) error {
	data, err := json.Marshal(v)
	if err != nil {
		return err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// dieWithParent asks for the graceful shutdown once the process that started this one is
// gone (even killed with SIGKILL), so no API server outlives its tests. It polls instead of
// using PR_SET_PDEATHSIG, which needs code between fork and exec in the parent: a Python
// test process that has loaded gRPC aborts there.
func dieWithParent() {
	parent := os.Getppid()
	for range time.Tick(500 * time.Millisecond) {
		if os.Getppid() != parent {
			_ = syscall.Kill(os.Getpid(), syscall.SIGTERM)
			return
		}
	}
}
