package node

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/c8s-dev/c8s/launcher/node/reattest"
)

// What the node agent's re-attestation tells Kubernetes through the
// KubeClient: pod conditions, events, and the owner's bundle in a
// ConfigMap.

// eventComponent is the source of the agent's events.
const eventComponent = "c8s-node-agent"

var _ reattest.Reporter = (*KubeClient)(nil)

// SetPodCondition implements reattest.Reporter: a strategic merge patch
// of the pod's status conditions (merged by type, so the kubelet's stay),
// keeping the transition time while the status does not change. A pod
// whose UID is not p's (deleted and created again) is left alone.
func (k *KubeClient) SetPodCondition(ctx context.Context, p reattest.Pod, c reattest.Condition) error {
	pod, err := k.Clientset.CoreV1().Pods(p.Namespace).Get(ctx, p.Name, metav1.GetOptions{})
	if err != nil {
		return err
	}
	if p.UID != "" && string(pod.UID) != p.UID {
		return fmt.Errorf("pod %s is another pod now (uid %s, not %s)", p, pod.UID, p.UID)
	}
	probed := metav1.NewTime(c.Probed.UTC().Truncate(time.Second))
	transition := probed
	for _, cur := range pod.Status.Conditions {
		if string(cur.Type) == reattest.ConditionType && string(cur.Status) == string(c.Status) && !cur.LastTransitionTime.IsZero() {
			transition = cur.LastTransitionTime
		}
	}
	patch, err := json.Marshal(map[string]any{"status": map[string]any{"conditions": []corev1.PodCondition{{
		Type:               reattest.ConditionType,
		Status:             corev1.ConditionStatus(c.Status),
		Reason:             c.Reason,
		Message:            c.Message,
		LastProbeTime:      probed,
		LastTransitionTime: transition,
	}}}})
	if err != nil {
		return err
	}
	_, err = k.Clientset.CoreV1().Pods(p.Namespace).Patch(ctx, p.Name, types.StrategicMergePatchType, patch, metav1.PatchOptions{}, "status")
	return err
}

// PodEvent implements reattest.Reporter.
func (k *KubeClient) PodEvent(ctx context.Context, p reattest.Pod, typ, reason, message string) error {
	return k.event(ctx, p.Namespace, corev1.ObjectReference{Kind: "Pod", APIVersion: "v1", Namespace: p.Namespace, Name: p.Name, UID: types.UID(p.UID)}, typ, reason, message)
}

// NodeEvent implements reattest.Reporter: an event on this node's Node
// (in namespace default, as kubectl looks for them).
func (k *KubeClient) NodeEvent(ctx context.Context, typ, reason, message string) error {
	ref := corev1.ObjectReference{Kind: "Node", APIVersion: "v1", Name: k.NodeName, UID: types.UID(k.NodeName)}
	if n, err := k.Clientset.CoreV1().Nodes().Get(ctx, k.NodeName, metav1.GetOptions{}); err == nil {
		ref.UID = n.UID
	}
	return k.event(ctx, metav1.NamespaceDefault, ref, typ, reason, message)
}

func (k *KubeClient) event(ctx context.Context, ns string, ref corev1.ObjectReference, typ, reason, message string) error {
	now := metav1.Now()
	const maxMessage = 1024 // the API server's limit on an event's note
	if len(message) > maxMessage {
		message = message[:maxMessage-3] + "..."
	}
	_, err := k.Clientset.CoreV1().Events(ns).Create(ctx, &corev1.Event{
		ObjectMeta:          metav1.ObjectMeta{GenerateName: ref.Name + ".", Namespace: ns},
		InvolvedObject:      ref,
		Reason:              reason,
		Message:             message,
		Type:                typ,
		Source:              corev1.EventSource{Component: eventComponent, Host: k.NodeName},
		FirstTimestamp:      now,
		LastTimestamp:       now,
		Count:               1,
		ReportingController: "c8s.io/node-agent",
		ReportingInstance:   eventComponent + "-" + k.NodeName,
	}, metav1.CreateOptions{})
	return err
}

// ConfigMapSource is the owner's signed bundle (the compact JWS) in key
// Key of a ConfigMap. The signature, not the ConfigMap's RBAC, makes it
// the owner's: whoever can write the ConfigMap (a cluster or node admin)
// can withhold or replay a bundle, never forge one.
type ConfigMapSource struct {
	Clientset kubernetes.Interface
	// Namespace and ConfigMap name it.
	Namespace, ConfigMap string
	// Key is the data key (default DefaultBundleKey).
	Key string
}

// DefaultBundleKey is the ConfigMap key of the bundle.
const DefaultBundleKey = "bundle.jws"

// Name implements reattest.Source.
func (c ConfigMapSource) Name() string {
	return fmt.Sprintf("ConfigMap %s/%s key %s", c.Namespace, c.ConfigMap, c.key())
}

func (c ConfigMapSource) key() string {
	if c.Key == "" {
		return DefaultBundleKey
	}
	return c.Key
}

// Read implements reattest.Source.
func (c ConfigMapSource) Read(ctx context.Context) ([]byte, error) {
	cm, err := c.Clientset.CoreV1().ConfigMaps(c.Namespace).Get(ctx, c.ConfigMap, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, fmt.Errorf("%s: %w", c.Name(), reattest.ErrNoBundle)
	}
	if err != nil {
		return nil, err
	}
	if v, ok := cm.Data[c.key()]; ok {
		return []byte(v), nil
	}
	if v, ok := cm.BinaryData[c.key()]; ok {
		return v, nil
	}
	return nil, errors.Join(fmt.Errorf("%s has no key %s", c.Name(), c.key()), reattest.ErrNoBundle)
}
