// Command refdriver is the Go reference driver the benchmarks (bench/peers.py) hold
// dra-plugin against: the same job for the same simulated node, written the way the
// production DRA drivers are (k8s.io/dynamic-resource-allocation/kubeletplugin for the
// kubelet's gRPC services, registration, claim fetching and ResourceSlice publishing;
// tags.cncf.io/container-device-interface for the claim CDI specs; the kubelet's
// checkpoint manager for the prepared-claims record). It is a measuring stick, not a
// product: no health, no sharing checks, no opaque configs.
//
// One process serves every driver found in --slices (ResourceSlices as
// `dra-plugin discover -o json` prints them), one kubeletplugin helper per driver.
// A prepare fetches the claim (the library does), writes one CDI spec per claim named
// and shaped as dra-plugin's (kind k8s.<driver>/claim, device <claim uid>-<device>,
// with the container edits --edits gives for the device), and records the claim in
// the driver's checkpoint (read, changed and written whole, fsync'd, per call, as the
// DRA example driver and NVIDIA's do); unprepare removes the spec and the record entry.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"sync"
	"syscall"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/klog/v2"
	"k8s.io/kubernetes/pkg/kubelet/checkpointmanager"
	"k8s.io/kubernetes/pkg/kubelet/checkpointmanager/checksum"
	cmerrors "k8s.io/kubernetes/pkg/kubelet/checkpointmanager/errors"
	cdiapi "tags.cncf.io/container-device-interface/pkg/cdi"
	cdispec "tags.cncf.io/container-device-interface/specs-go"
)

const checkpointFile = "checkpoint.json"

type settings struct {
	nodeName, kubeconfig, registrarDir, pluginsDir, cdiDir, stateDir string
	slicesFile, editsFile, readyFile, contentType                    string
	qps                                                              float64
	burst                                                            int
	serialize                                                        bool
}

// edits is what --edits holds per driver: container edits per device and for the spec.
type edits struct {
	Devices map[string]cdispec.ContainerEdits `json:"devices"`
	Common  *cdispec.ContainerEdits           `json:"common,omitempty"`
}

// preparedDevice and preparedClaim are one claim's entry in the checkpoint.
type preparedDevice struct {
	Requests []string `json:"requests"`
	Pool     string   `json:"pool"`
	Device   string   `json:"device"`
	CDIIDs   []string `json:"cdiDeviceIDs"`
}

type preparedClaim struct {
	Namespace string           `json:"namespace"`
	Name      string           `json:"name"`
	Devices   []preparedDevice `json:"devices"`
}

// checkpoint implements checkpointmanager.Checkpoint: the claims and their checksum.
type checkpoint struct {
	Checksum checksum.Checksum           `json:"checksum"`
	Claims   map[types.UID]preparedClaim `json:"claims"`
}

func (c *checkpoint) MarshalCheckpoint() ([]byte, error) {
	c.Checksum = 0
	body, err := json.Marshal(c)
	if err != nil {
		return nil, err
	}
	c.Checksum = checksum.New(body)
	return json.Marshal(c)
}

func (c *checkpoint) UnmarshalCheckpoint(data []byte) error { return json.Unmarshal(data, c) }

func (c *checkpoint) VerifyChecksum() error {
	sum := c.Checksum
	c.Checksum = 0
	body, err := json.Marshal(c)
	c.Checksum = sum
	if err != nil {
		return err
	}
	return sum.Verify(body)
}

// driver is one DRA driver's plugin (kubeletplugin.DRAPlugin).
type driver struct {
	name, node string
	edits      edits
	cdi        *cdiapi.Cache
	cp         checkpointmanager.CheckpointManager
	mu         sync.Mutex // the library serializes calls by default; this covers Serialize(false)
}

func (d *driver) kind() string { return "k8s." + d.name + "/claim" }

func (d *driver) specName(uid types.UID) string {
	// JSON, as dra-plugin writes its specs (the CDI library's default would be YAML).
	return cdiapi.GenerateTransientSpecName("k8s."+d.name, "claim", string(uid)) + ".json"
}

func (d *driver) load() (*checkpoint, error) {
	cp := &checkpoint{Claims: map[types.UID]preparedClaim{}}
	err := d.cp.GetCheckpoint(checkpointFile, cp)
	if errors.Is(err, cmerrors.ErrCheckpointNotFound) {
		return &checkpoint{Claims: map[types.UID]preparedClaim{}}, nil
	}
	if cp.Claims == nil {
		cp.Claims = map[types.UID]preparedClaim{}
	}
	return cp, err
}

func (d *driver) PrepareResourceClaims(_ context.Context, claims []*resourceapi.ResourceClaim) (map[types.UID]kubeletplugin.PrepareResult, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	cp, err := d.load()
	if err != nil {
		return nil, fmt.Errorf("read checkpoint: %w", err)
	}
	out := make(map[types.UID]kubeletplugin.PrepareResult, len(claims))
	for _, claim := range claims {
		if done, ok := cp.Claims[claim.UID]; ok { // prepared before: the same answer
			out[claim.UID] = kubeletplugin.PrepareResult{Devices: asResult(done)}
			continue
		}
		prepared, err := d.prepareOne(claim)
		if err != nil {
			out[claim.UID] = kubeletplugin.PrepareResult{Err: err}
			continue
		}
		cp.Claims[claim.UID] = prepared
		out[claim.UID] = kubeletplugin.PrepareResult{Devices: asResult(prepared)}
	}
	if err := d.cp.CreateCheckpoint(checkpointFile, cp); err != nil {
		return nil, fmt.Errorf("write checkpoint: %w", err)
	}
	return out, nil
}

func (d *driver) prepareOne(claim *resourceapi.ResourceClaim) (preparedClaim, error) {
	pc := preparedClaim{Namespace: claim.Namespace, Name: claim.Name}
	spec := &cdispec.Spec{Kind: d.kind()}
	if d.edits.Common != nil {
		spec.ContainerEdits = *d.edits.Common
	}
	for _, r := range claim.Status.Allocation.Devices.Results {
		if r.Driver != d.name || r.Pool != d.node {
			continue
		}
		dev, ok := d.edits.Devices[r.Device]
		if !ok {
			return pc, fmt.Errorf("device %s/%s is not on this node", r.Pool, r.Device)
		}
		cdiName := string(claim.UID) + "-" + r.Device
		spec.Devices = append(spec.Devices, cdispec.Device{Name: cdiName, ContainerEdits: dev})
		pc.Devices = append(pc.Devices, preparedDevice{
			Requests: []string{r.Request},
			Pool:     r.Pool,
			Device:   r.Device,
			CDIIDs:   []string{d.kind() + "=" + cdiName},
		})
	}
	if len(spec.Devices) == 0 {
		return pc, nil
	}
	version, err := cdiapi.MinimumRequiredVersion(spec)
	if err != nil {
		return pc, fmt.Errorf("CDI version: %w", err)
	}
	spec.Version = version
	if err := d.cdi.WriteSpec(spec, d.specName(claim.UID)); err != nil {
		return pc, fmt.Errorf("write CDI spec: %w", err)
	}
	return pc, nil
}

func asResult(pc preparedClaim) []kubeletplugin.Device {
	out := make([]kubeletplugin.Device, 0, len(pc.Devices))
	for _, dev := range pc.Devices {
		out = append(out, kubeletplugin.Device{
			Requests: dev.Requests, PoolName: dev.Pool, DeviceName: dev.Device, CDIDeviceIDs: dev.CDIIDs,
		})
	}
	return out
}

func (d *driver) UnprepareResourceClaims(_ context.Context, claims []kubeletplugin.NamespacedObject) (map[types.UID]error, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	cp, err := d.load()
	if err != nil {
		return nil, fmt.Errorf("read checkpoint: %w", err)
	}
	out := make(map[types.UID]error, len(claims))
	for _, claim := range claims {
		if err := d.cdi.RemoveSpec(d.specName(claim.UID)); err != nil {
			out[claim.UID] = fmt.Errorf("remove CDI spec: %w", err)
			continue
		}
		delete(cp.Claims, claim.UID)
		out[claim.UID] = nil
	}
	if err := d.cp.CreateCheckpoint(checkpointFile, cp); err != nil {
		return nil, fmt.Errorf("write checkpoint: %w", err)
	}
	return out, nil
}

func (d *driver) HandleError(ctx context.Context, err error, msg string) {
	klog.FromContext(ctx).Error(err, msg, "driver", d.name)
}

func (d *driver) WatchHealthStatus(context.Context, chan<- kubeletplugin.DeviceHealthReport) error {
	return kubeletplugin.ErrHealthNotSupported
}

func readJSON(path string, into any) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	return json.Unmarshal(data, into)
}

// pools reads the slices file: devices per driver, in the order they appear.
func pools(path string) (map[string][]resourceapi.Device, []string, error) {
	var list struct {
		Items []resourceapi.ResourceSlice `json:"items"`
	}
	if err := readJSON(path, &list); err != nil {
		return nil, nil, fmt.Errorf("read %s: %w", path, err)
	}
	byDriver := map[string][]resourceapi.Device{}
	var order []string
	for _, s := range list.Items {
		if _, seen := byDriver[s.Spec.Driver]; !seen {
			order = append(order, s.Spec.Driver)
		}
		byDriver[s.Spec.Driver] = append(byDriver[s.Spec.Driver], s.Spec.Devices...)
	}
	return byDriver, order, nil
}

func run(ctx context.Context, s settings) error {
	devices, order, err := pools(s.slicesFile)
	if err != nil {
		return err
	}
	allEdits := map[string]edits{}
	if err := readJSON(s.editsFile, &allEdits); err != nil {
		return fmt.Errorf("read %s: %w", s.editsFile, err)
	}
	config, err := clientcmd.BuildConfigFromFlags("", s.kubeconfig)
	if err != nil {
		return fmt.Errorf("kubeconfig: %w", err)
	}
	config.QPS, config.Burst = float32(s.qps), s.burst
	if s.contentType != "" {
		config.ContentType, config.AcceptContentTypes = s.contentType, s.contentType
	}
	client, err := kubernetes.NewForConfig(config)
	if err != nil {
		return err
	}
	node, err := client.CoreV1().Nodes().Get(ctx, s.nodeName, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("node %s: %w", s.nodeName, err)
	}
	cache, err := cdiapi.NewCache(cdiapi.WithSpecDirs(s.cdiDir))
	if err != nil {
		return fmt.Errorf("CDI cache: %w", err)
	}
	// One helper per driver, started side by side as separate drivers' pods would be:
	// the library's slice controller waits for its informer in 1 s steps.
	helpers := make([]*kubeletplugin.Helper, len(order))
	errs := make([]error, len(order))
	var wg sync.WaitGroup
	for i, name := range order {
		wg.Add(1)
		go func() {
			defer wg.Done()
			helpers[i], errs[i] = startDriver(ctx, s, name, node.UID, client, cache, devices[name], allEdits[name])
		}()
	}
	wg.Wait()
	defer func() {
		for _, h := range helpers {
			h.Stop() // nil-safe
		}
	}()
	if err := errors.Join(errs...); err != nil {
		return err
	}
	if s.readyFile != "" {
		if err := os.WriteFile(s.readyFile, []byte("ready\n"), 0o644); err != nil {
			return err
		}
	}
	<-ctx.Done()
	return nil
}

func startDriver(ctx context.Context, s settings, name string, nodeUID types.UID, client kubernetes.Interface,
	cache *cdiapi.Cache, devices []resourceapi.Device, e edits) (*kubeletplugin.Helper, error) {
	state := filepath.Join(s.stateDir, name)
	for _, dir := range []string{state, s.registrarDir, filepath.Join(s.pluginsDir, name)} {
		if err := os.MkdirAll(dir, 0o750); err != nil {
			return nil, err
		}
	}
	cp, err := checkpointmanager.NewCheckpointManager(state)
	if err != nil {
		return nil, err
	}
	d := &driver{name: name, node: s.nodeName, edits: e, cdi: cache, cp: cp}
	h, err := kubeletplugin.Start(ctx, d,
		kubeletplugin.DriverName(name),
		kubeletplugin.NodeName(s.nodeName),
		kubeletplugin.NodeUID(nodeUID),
		kubeletplugin.KubeClient(client),
		kubeletplugin.RegistrarDirectoryPath(s.registrarDir),
		kubeletplugin.PluginDataDirectoryPath(filepath.Join(s.pluginsDir, name)),
		kubeletplugin.HealthService(false),
		kubeletplugin.Serialize(s.serialize),
	)
	if err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	pool := resourceslice.Pool{Slices: []resourceslice.Slice{{Devices: devices}}}
	resources := resourceslice.DriverResources{Pools: map[string]resourceslice.Pool{s.nodeName: pool}}
	if err := h.PublishResources(ctx, resources); err != nil {
		h.Stop()
		return nil, fmt.Errorf("publish %s: %w", name, err)
	}
	return h, nil
}

func main() {
	var s settings
	flag.StringVar(&s.nodeName, "node-name", "", "the node the devices are on (its Node must exist)")
	flag.StringVar(&s.kubeconfig, "kubeconfig", "", "kubeconfig of the API server")
	flag.Float64Var(&s.qps, "kube-api-qps", 5, "client QPS (client-go's default: 5)")
	flag.IntVar(&s.burst, "kube-api-burst", 10, "client burst (client-go's default: 10)")
	flag.StringVar(&s.contentType, "content-type", "", "client content type (default: client-go's)")
	flag.StringVar(&s.registrarDir, "registrar-dir", kubeletplugin.KubeletRegistryDir, "the kubelet's plugin registry directory")
	flag.StringVar(&s.pluginsDir, "plugins-dir", kubeletplugin.KubeletPluginsDir, "the kubelet's plugins directory (<dir>/<driver>/dra.sock)")
	flag.StringVar(&s.cdiDir, "cdi-dir", "/var/run/cdi", "where the claim CDI specs go")
	flag.StringVar(&s.stateDir, "state-dir", "/var/lib/refdriver", "checkpoint directory (<dir>/<driver>/checkpoint.json)")
	flag.StringVar(&s.slicesFile, "slices", "", "ResourceSlices to publish, as `dra-plugin discover -o json` prints them")
	flag.StringVar(&s.editsFile, "edits", "", "CDI container edits per driver and device (JSON)")
	flag.StringVar(&s.readyFile, "ready-file", "", "written once every driver is started and publishing")
	flag.BoolVar(&s.serialize, "serialize", true, "the library serializes prepare/unprepare calls (its default)")
	klog.InitFlags(nil)
	flag.Parse()
	if s.nodeName == "" || s.slicesFile == "" || s.editsFile == "" {
		fmt.Fprintln(os.Stderr, "refdriver: --node-name, --slices and --edits are required")
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if err := run(ctx, s); err != nil {
		fmt.Fprintln(os.Stderr, "refdriver:", err)
		os.Exit(1)
	}
}
