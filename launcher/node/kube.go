package node

import (
	"context"
	"errors"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/c8s-dev/c8s/launcher/node/labels"
)

// KubeClient is the Client for a real API server, through client-go: it
// reads the Node named NodeName and sends JSON merge patches to it and to
// its status subresource.
type KubeClient struct {
	Clientset kubernetes.Interface
	NodeName  string
}

// NewKubeClient returns a KubeClient for nodeName from a kubeconfig file,
// or from the pod's service account when kubeconfig is empty (the
// DaemonSet case).
func NewKubeClient(kubeconfig, nodeName string) (*KubeClient, error) {
	if nodeName == "" {
		return nil, errors.New("node-agent: no node name: pass --node-name or set NODE_NAME (the DaemonSet sets it from spec.nodeName)")
	}
	var (
		cfg *rest.Config
		err error
	)
	if kubeconfig != "" {
		cfg, err = clientcmd.BuildConfigFromFlags("", kubeconfig)
	} else {
		cfg, err = rest.InClusterConfig()
	}
	if err != nil {
		return nil, fmt.Errorf("node-agent: Kubernetes client configuration: %w (outside a pod, pass --kubeconfig)", err)
	}
	cfg.UserAgent = "c8s-node-agent"
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("node-agent: Kubernetes client: %w", err)
	}
	return &KubeClient{Clientset: cs, NodeName: nodeName}, nil
}

// Node implements Client.
func (k *KubeClient) Node(ctx context.Context) (labels.Node, map[string]string, error) {
	n, err := k.Clientset.CoreV1().Nodes().Get(ctx, k.NodeName, metav1.GetOptions{})
	if err != nil {
		return labels.Node{}, nil, err
	}
	out := labels.Node{Labels: n.Labels, Annotations: n.Annotations}
	for _, t := range n.Spec.Taints {
		out.Taints = append(out.Taints, labels.Taint{Key: t.Key, Value: t.Value, Effect: string(t.Effect)})
	}
	return out, capacityStrings(n.Status.Capacity), nil
}

// Patch implements Client.
func (k *KubeClient) Patch(ctx context.Context, patch []byte) error {
	_, err := k.Clientset.CoreV1().Nodes().Patch(ctx, k.NodeName, types.MergePatchType, patch, metav1.PatchOptions{})
	return err
}

// PatchStatus implements Client.
func (k *KubeClient) PatchStatus(ctx context.Context, patch []byte) error {
	_, err := k.Clientset.CoreV1().Nodes().Patch(ctx, k.NodeName, types.MergePatchType, patch, metav1.PatchOptions{}, "status")
	return err
}

// PodUnits implements PodCounter: it lists the pods bound to the node and
// adds up, per resource, what the scheduler counts for those not yet
// Succeeded or Failed: the RuntimeClass overhead plus the larger of the
// containers' summed requests and the largest init container request
// (restartable init containers, sidecars, are counted with the
// containers).
func (k *KubeClient) PodUnits(ctx context.Context) (map[string]int64, error) {
	pods, err := k.Clientset.CoreV1().Pods(metav1.NamespaceAll).List(ctx, metav1.ListOptions{
		FieldSelector: fields.OneTermEqualSelector("spec.nodeName", k.NodeName).String(),
	})
	if err != nil {
		return nil, fmt.Errorf("node-agent: listing the node's pods: %w", err)
	}
	units := map[string]int64{}
	for i := range pods.Items {
		p := &pods.Items[i]
		if p.Spec.NodeName != k.NodeName || p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
			continue
		}
		for name, n := range podRequests(&p.Spec) {
			units[name] += n
		}
	}
	return units, nil
}

// podRequests is one pod's effective request per resource, in whole units.
func podRequests(spec *corev1.PodSpec) map[string]int64 {
	sum := map[string]int64{}
	for _, c := range spec.Containers {
		for name, q := range c.Resources.Requests {
			sum[string(name)] += q.Value()
		}
	}
	initMax := map[string]int64{}
	sidecars := map[string]int64{}
	for _, c := range spec.InitContainers {
		for name, q := range c.Resources.Requests {
			if c.RestartPolicy != nil && *c.RestartPolicy == corev1.ContainerRestartPolicyAlways {
				sidecars[string(name)] += q.Value()
				continue
			}
			// An init container runs beside the sidecars started before it.
			initMax[string(name)] = max(initMax[string(name)], q.Value()+sidecars[string(name)])
		}
	}
	out := map[string]int64{}
	for name, n := range sum {
		out[name] = n + sidecars[name]
	}
	for name, n := range sidecars {
		if _, ok := sum[name]; !ok {
			out[name] = n
		}
	}
	for name, n := range initMax {
		out[name] = max(out[name], n)
	}
	for name, q := range spec.Overhead {
		out[string(name)] += q.Value()
	}
	return out
}

func capacityStrings(rl corev1.ResourceList) map[string]string {
	out := make(map[string]string, len(rl))
	for name, q := range rl {
		out[string(name)] = q.String()
	}
	return out
}
