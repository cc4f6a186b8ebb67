// Command node-kubelet is the real kubelet of k8s.io/kubernetes (the version go.mod pins),
// for the single-node tests (fakes/node): a real kubelet process driving containerd, as
// opposed to judges/cmd/kubelet, which drives only the kubelet's DRA manager.
package main

import (
	"context"
	"os"

	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register"
	_ "k8s.io/component-base/metrics/prometheus/clientgo"
	_ "k8s.io/component-base/metrics/prometheus/version"
	"k8s.io/kubernetes/cmd/kubelet/app"
)

func main() {
	os.Exit(cli.Run(app.NewKubeletCommand(context.Background())))
}
