package nodeagent

import (
	"context"
	"errors"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/c8s-dev/c8s/launcher/nodelabels"
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
		return nil, errors.New("nodeagent: no node name: pass --node-name or set NODE_NAME (the DaemonSet sets it from spec.nodeName)")
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
		return nil, fmt.Errorf("nodeagent: Kubernetes client configuration: %w (outside a pod, pass --kubeconfig)", err)
	}
	cfg.UserAgent = "c8s-node-agent"
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("nodeagent: Kubernetes client: %w", err)
	}
	return &KubeClient{Clientset: cs, NodeName: nodeName}, nil
}

// Node implements Client.
func (k *KubeClient) Node(ctx context.Context) (nodelabels.Node, map[string]string, error) {
	n, err := k.Clientset.CoreV1().Nodes().Get(ctx, k.NodeName, metav1.GetOptions{})
	if err != nil {
		return nodelabels.Node{}, nil, err
	}
	out := nodelabels.Node{Labels: n.Labels, Annotations: n.Annotations}
	for _, t := range n.Spec.Taints {
		out.Taints = append(out.Taints, nodelabels.Taint{Key: t.Key, Value: t.Value, Effect: string(t.Effect)})
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

func capacityStrings(rl corev1.ResourceList) map[string]string {
	out := make(map[string]string, len(rl))
	for name, q := range rl {
		out[string(name)] = q.String()
	}
	return out
}
