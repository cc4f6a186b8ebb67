// Command kubelet plays a node's kubelet with the kubelet's own DRA code, so the tests
// hold the plugin to what a real kubelet does rather than to our emulator:
//
//   - plugin registration through the kubelet's plugin watcher and plugin manager
//     (pkg/kubelet/pluginmanager) over the registry directory, with the DRA manager's
//     registration handler (pkg/kubelet/cm/dra/plugin);
//   - NodePrepareResources/NodeUnprepareResources per pod, batched per driver, with the
//     claim fetched from the API server and the kubelet's claim checkpoint
//     (pkg/kubelet/cm/dra Manager);
//   - the device health stream, opened when the plugin offers it and the
//     ResourceHealthStatus gate is on;
//   - ResourceSlice wiping: all of the node's slices at start, and a driver's slices
//     once no plugin of it has been connected for the wiping delay.
//
// No container runtime: what the kubelet would hand to the runtime (the CDI device IDs
// per container) is printed instead. It is driven by JSON lines on stdin, one answer
// line per request on stdout (echoing "id"), and event lines as things happen:
//
//	{"op":"prepare","pod":"ns/name"}     -> {"ok":true,"cdi":{"<container>":["vendor/class=dev",...]}}
//	{"op":"unprepare","pod":"ns/name"}   -> {"ok":true}
//	{"op":"health","pod":"ns/name"}      -> {"ok":true,"containers":{"<container>":[ResourceStatus...]}}
//	{"op":"plugins","driver":"d"}        -> {"ok":true,"registered":true}
//	every answer may be {"ok":false,"error":"..."}
//	events: {"event":"registered"|"deregistered","driver":...,"endpoint":...},
//	        {"event":"health","pod":"ns/name","containers":{...}} (the kubelet's pod update)
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"strings"
	"sync"
	"time"
	_ "unsafe" // go:linkname, see initPluginManager

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
	"k8s.io/kubernetes/pkg/kubelet/cm/dra"
	"k8s.io/kubernetes/pkg/kubelet/pluginmanager"
	"k8s.io/kubernetes/pkg/kubelet/pluginmanager/cache"
)

// initPluginManager is the DRA manager's own "use instead of Start" entry
// (initDRAPluginManager), the only way to choose the wiping delay: Start hard-codes
// the kubelet's 30 s, which tests cannot afford to wait for every time. Start adds
// only the reconcile loop for inactive pods, which needs the kubelet's pod sources.
//
//go:linkname initPluginManager k8s.io/kubernetes/pkg/kubelet/cm/dra.(*Manager).initDRAPluginManager
func initPluginManager(m *dra.Manager, ctx context.Context, getNode dra.GetNodeFunc, wipingDelay time.Duration)

type out struct {
	mu  sync.Mutex
	enc *json.Encoder
}

func (o *out) send(v map[string]any) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if err := o.enc.Encode(v); err != nil {
		klog.ErrorS(err, "writing to stdout")
	}
}

// handler wraps the DRA registration handler to report registrations as events; the
// calls themselves go to the kubelet's code unchanged.
type handler struct {
	cache.PluginHandler
	out   *out
	mu    sync.Mutex
	known map[string]int // driver -> registered endpoints
}

func (h *handler) RegisterPlugin(ctx context.Context, name, endpoint string, versions []string, timeout *time.Duration) error {
	err := h.PluginHandler.RegisterPlugin(ctx, name, endpoint, versions, timeout)
	ev := map[string]any{"event": "registered", "driver": name, "endpoint": endpoint, "versions": versions}
	if err != nil {
		ev["error"] = err.Error()
	} else {
		h.mu.Lock()
		h.known[name]++
		h.mu.Unlock()
	}
	h.out.send(ev)
	return err
}

func (h *handler) DeRegisterPlugin(ctx context.Context, name, endpoint string) {
	h.PluginHandler.DeRegisterPlugin(ctx, name, endpoint)
	h.mu.Lock()
	h.known[name]--
	h.mu.Unlock()
	h.out.send(map[string]any{"event": "deregistered", "driver": name, "endpoint": endpoint})
}

type node struct {
	client  kubernetes.Interface
	manager *dra.Manager
	out     *out
	reg     *handler
	mu      sync.Mutex
	pods    map[string]*v1.Pod // uid -> pod, as the kubelet's pod manager holds them
}

func (n *node) pod(ctx context.Context, ref string) (*v1.Pod, error) {
	ns, name, ok := strings.Cut(ref, "/")
	if !ok {
		return nil, fmt.Errorf("pod %q: want namespace/name", ref)
	}
	pod, err := n.client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		// Unprepare of a pod already deleted from the API: the kubelet still has it.
		n.mu.Lock()
		defer n.mu.Unlock()
		for _, known := range n.pods {
			if known.Namespace == ns && known.Name == name {
				return known, nil
			}
		}
		return nil, err
	}
	n.mu.Lock()
	n.pods[string(pod.UID)] = pod
	n.mu.Unlock()
	return pod, nil
}

// containerHealth is what the kubelet writes to the pod's containerStatuses
// allocatedResourcesStatus for the pod's containers.
func (n *node) containerHealth(pod *v1.Pod) map[string]any {
	status := &v1.PodStatus{}
	for _, c := range pod.Spec.Containers {
		status.ContainerStatuses = append(status.ContainerStatuses, v1.ContainerStatus{Name: c.Name})
	}
	n.manager.UpdateAllocatedResourcesStatus(klog.Background(), pod, status)
	containers := map[string]any{}
	for _, cs := range status.ContainerStatuses {
		containers[cs.Name] = cs.AllocatedResourcesStatus
	}
	return containers
}

func (n *node) handle(ctx context.Context, req map[string]any) map[string]any {
	op, _ := req["op"].(string)
	ref, _ := req["pod"].(string)
	switch op {
	case "prepare":
		pod, err := n.pod(ctx, ref)
		if err != nil {
			return map[string]any{"error": err.Error()}
		}
		if err := n.manager.PrepareResources(ctx, pod); err != nil {
			return map[string]any{"error": err.Error()}
		}
		cdi := map[string][]string{}
		for i := range pod.Spec.Containers {
			info, err := n.manager.GetResources(pod, &pod.Spec.Containers[i])
			if err != nil {
				return map[string]any{"error": err.Error()}
			}
			ids := []string{}
			for _, d := range info.CDIDevices {
				ids = append(ids, d.Name)
			}
			cdi[pod.Spec.Containers[i].Name] = ids
		}
		return map[string]any{"ok": true, "uid": string(pod.UID), "cdi": cdi}
	case "unprepare":
		pod, err := n.pod(ctx, ref)
		if err != nil {
			return map[string]any{"error": err.Error()}
		}
		if err := n.manager.UnprepareResources(ctx, pod); err != nil {
			return map[string]any{"error": err.Error()}
		}
		return map[string]any{"ok": true}
	case "health":
		pod, err := n.pod(ctx, ref)
		if err != nil {
			return map[string]any{"error": err.Error()}
		}
		return map[string]any{"ok": true, "containers": n.containerHealth(pod)}
	case "plugins":
		driver, _ := req["driver"].(string)
		n.reg.mu.Lock()
		count := n.reg.known[driver]
		n.reg.mu.Unlock()
		return map[string]any{"ok": true, "registered": count > 0, "endpoints": count}
	}
	return map[string]any{"error": fmt.Sprintf("unknown op %q", op)}
}

// followHealth plays the kubelet's status manager: each update names pods whose
// devices changed health, and the kubelet recomputes their allocatedResourcesStatus.
func (n *node) followHealth(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case update := <-n.manager.Updates():
			for _, uid := range update.PodUIDs {
				n.mu.Lock()
				pod := n.pods[uid]
				n.mu.Unlock()
				if pod == nil {
					continue
				}
				n.out.send(map[string]any{
					"event":      "health",
					"pod":        pod.Namespace + "/" + pod.Name,
					"containers": n.containerHealth(pod),
				})
			}
		}
	}
}

func main() {
	klog.InitFlags(nil)
	kubeconfig := flag.String("kubeconfig", "", "kubeconfig of the API server (required)")
	nodeName := flag.String("node-name", "", "the node this kubelet plays (required)")
	registry := flag.String("registry-dir", "", "plugin registration directory the plugin watcher watches (required)")
	stateDir := flag.String("state-dir", "", "directory of the DRA manager's checkpoint (required)")
	wipingDelay := flag.Duration("wiping-delay", 30*time.Second, "how long a driver may stay disconnected before its ResourceSlices are wiped (the kubelet's is 30s)")
	// The kubelet's own flag: protobuf by default, as a real kubelet talks to a real API
	// server; application/json for servers that speak only JSON (the tests' fake).
	contentType := flag.String("kube-api-content-type", "application/vnd.kubernetes.protobuf", "content type of requests sent to the API server")
	gates := flag.String("feature-gates", "", "kubelet feature gates, e.g. ResourceHealthStatus=false (as on 1.34/1.35)")
	flag.Parse()
	if *kubeconfig == "" || *nodeName == "" || *registry == "" || *stateDir == "" {
		fmt.Fprintln(os.Stderr, "--kubeconfig, --node-name, --registry-dir and --state-dir are required")
		os.Exit(2)
	}
	if *gates != "" {
		if err := utilfeature.DefaultMutableFeatureGate.Set(*gates); err != nil {
			fmt.Fprintln(os.Stderr, "--feature-gates:", err)
			os.Exit(2)
		}
	}
	config, err := clientcmd.BuildConfigFromFlags("", *kubeconfig)
	if err != nil {
		fmt.Fprintln(os.Stderr, "kubeconfig:", err)
		os.Exit(2)
	}
	config.ContentType = *contentType
	client, err := kubernetes.NewForConfig(config)
	if err != nil {
		fmt.Fprintln(os.Stderr, "client:", err)
		os.Exit(2)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	logger := klog.Background()
	ctx = klog.NewContext(ctx, logger)

	manager, err := dra.NewManager(logger, client, *stateDir)
	if err != nil {
		fmt.Fprintln(os.Stderr, "DRA manager:", err)
		os.Exit(1)
	}
	getNode := func(ctx context.Context) (*v1.Node, error) {
		return client.CoreV1().Nodes().Get(ctx, *nodeName, metav1.GetOptions{})
	}
	// Wipes all of the node's slices in the background, as at a kubelet's start.
	initPluginManager(manager, ctx, getNode, *wipingDelay)
	defer manager.Stop()

	o := &out{enc: json.NewEncoder(os.Stdout)}
	reg := &handler{PluginHandler: manager.GetWatcherHandler(), out: o, known: map[string]int{}}
	plugins := pluginmanager.NewPluginManager(*registry, &record.FakeRecorder{})
	plugins.AddHandler(registerapi.DRAPlugin, reg)
	stop := make(chan struct{})
	defer close(stop)
	go plugins.Run(ctx, nil, stop)

	n := &node{client: client, manager: manager, out: o, reg: reg, pods: map[string]*v1.Pod{}}
	go n.followHealth(ctx)
	o.send(map[string]any{"event": "started", "gates": *gates})

	// Requests run one at a time, as the kubelet's pod workers do per pod; several
	// pods at once are not needed by the tests.
	scanner := bufio.NewScanner(os.Stdin)
	scanner.Buffer(make([]byte, 1<<20), 1<<20)
	for scanner.Scan() {
		line := strings.TrimSpace(scanner.Text())
		if line == "" {
			continue
		}
		var req map[string]any
		var answer map[string]any
		if err := json.Unmarshal([]byte(line), &req); err != nil {
			answer = map[string]any{"error": fmt.Sprintf("not a JSON object: %v", err)}
		} else {
			answer = n.handle(ctx, req)
			if id, ok := req["id"]; ok {
				answer["id"] = id
			}
		}
		if _, failed := answer["error"]; failed {
			answer["ok"] = false
		}
		o.send(answer)
	}
	// stdin closed: the test is done with this kubelet.
}
