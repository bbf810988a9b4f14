// Package policygen writes a pod's measured init data from its
// Kubernetes YAML, as Kata's genpolicy does for Kata's agent policy: the
// [policy] section (guest/api/policy) that the guest's agent enforces on
// every request of the untrusted host, for the pod's sandbox container
// and each of its containers, with the [kbs] section naming the broker
// and the secrets each container gets. `c8s-measure policy` is its CLI.
//
// It reads a Pod, or a workload whose pods share one template
// (Deployment, StatefulSet, DaemonSet, ReplicaSet, ReplicationController,
// Job, CronJob), from a YAML stream that may hold several documents;
// ConfigMaps and Secrets in the same stream pin the environment their
// keys give. It fills in what the kubelet and containerd 2.2 add to each
// container's OCI spec, so that the pod's real CreateContainer requests
// match:
//
//   - the sandbox (pause) container: containerd's default sandbox image
//     (DefaultSandboxImage), its args, env and user, containerd's
//     unprivileged-port and ping sysctls, its /dev/shm;
//   - args by Kubernetes' rules (command replaces the image's entrypoint,
//     args its cmd; $(VAR) references expanded), working dir (workingDir,
//     else the image's WORKDIR, else "/"), uid and gid (runAsUser and
//     runAsGroup, else the image's user resolved as the kubelet and
//     containerd do, else 0);
//   - env: containerd's default PATH, HOSTNAME (the pod's name, or the
//     pattern of the names a controller gives its pods), the image's env,
//     the pod's env (exact values; values the API server or the node fills
//     in, such as fieldRef, resourceFieldRef or secretKeyRef, as patterns),
//     the service links and KUBERNETES_* variables the kubelet injects;
//   - mounts: the service account token, configMap, secret, downward API
//     and projected volumes (shared, read-only), emptyDir volumes (kept
//     in guest memory: emptydir), sub-paths (shared, or a file passed by
//     value), the image's VOLUMEs and other node storage (shared, with a
//     warning); /dev/shm (the pod's, in guest memory: podshm),
//     /etc/hosts, /etc/hostname, /etc/resolv.conf and
//     /dev/termination-log are standard mounts the evaluator allows;
//   - capabilities (containerd's defaults plus add minus drop), privileged,
//     no_new_privileges, read-only root, host namespaces;
//   - exec: the commands of the pod's exec probes and lifecycle hooks,
//     which the kubelet runs; nothing else unless Options.Exec lists it;
//   - signals: the defaults, and the container's stop signal;
//   - logs (unless Options.NoLogs), stdin (stdin: true);
//   - layers: the image's layers (diff ID, dm-verity root, data blocks of
//     their layer disks, measurements/layer) when its layout was given, so
//     that the guest builds the root only from them; without them the
//     root is not pinned, with a warning;
//   - pull: the container's image reference, for the containers
//     Options.Pull names (digest-pinned images only), so that the guest
//     pulls and verifies the image itself where the node offers no layer
//     disks (pull.go).
//
// The image's entrypoint, cmd, env, working dir and user come from an OCI
// image layout (LoadImage) given per image; without one the pod spec must
// give command, workingDir and runAsUser, and Generate refuses, naming
// what is missing, a container it cannot pin. Images not pinned by digest
// are warned about (refused with Options.Strict).
//
// The document is deterministic (the same input gives the same bytes, so
// the same HOST_DATA and MRCONFIGID), and Generate checks that
// initdata.Parse reads back exactly the policy it meant to write.
package policygen

import (
	"bufio"
	"bytes"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"regexp"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8syaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"

	"github.com/c8s-dev/c8s/guest/api/initdata"
	policyapi "github.com/c8s-dev/c8s/guest/api/policy"
)

// DefaultSandboxImage is containerd 2.2's default sandbox image
// (pinned_images.sandbox), which containerd names in the sandbox
// container's io.kubernetes.cri.podsandbox.image-name annotation.
const DefaultSandboxImage = "registry.k8s.io/pause:3.10.1"

// DefaultClusterDomain is the kubelet's clusterDomain as kubeadm and
// most clusters set it.
const DefaultClusterDomain = "cluster.local"

// Options say what to generate beyond what the YAML states.
type Options struct {
	// Format is initdata.FormatC8s (default) or initdata.FormatCoCo.
	Format string
	// Algorithm is the digest algorithm of a CoCo document: sha256,
	// sha384 (default) or sha512.
	Algorithm string
	// SandboxImage is the node's sandbox image (DefaultSandboxImage).
	SandboxImage string
	// ClusterDomain is the cluster's DNS domain, the kubelet's
	// clusterDomain (DefaultClusterDomain): the end of a hostname the
	// pod takes as its FQDN (setHostnameAsFQDN).
	ClusterDomain string
	// Images are the images' configs, and Layouts the paths of OCI image
	// layouts to read them from (LoadImage), by image reference as the
	// pod spec (or SandboxImage) writes it, or by container name.
	Images  map[string]*Image
	Layouts map[string]string
	// Strict refuses images not pinned by digest, and images whose files
	// are not pinned (no layers) unless the guest pulls them.
	Strict bool
	// Exec lists, per container name, more argv (patterns) the host may
	// exec, and ExecStdin the containers whose execs may have stdin.
	Exec      map[string][][]policyapi.Pattern
	ExecStdin []string
	// NoLogs keeps every container's output from the host.
	NoLogs bool
	// Audit writes policy.audit = true: denials are logged, not enforced.
	Audit bool
	// KBS names the key broker (URL and PEM certificate); Secrets are the
	// broker resources to mount into containers.
	KBS     initdata.KBS
	Secrets []Secret
	// PortForward lists the pod ports the host may port-forward to.
	PortForward []uint32
	// Pull lets the guest pull, by container name, the container's image
	// itself when the node offers no layer disks (policy pull, pull.go).
	Pull map[string]Pull
}

// Pull is how the guest pulls one container's image.
type Pull struct {
	// Auth is the key broker resource of the registry's credentials
	// (policy pull_auth), or "".
	Auth string
	// PlainHTTP talks plain HTTP to the registry (test registries).
	PlainHTTP bool
	// CA is the PEM CA certificates of the registry (policy pull_ca):
	// the only roots the guest verifies it against; "": the guest
	// image's public bundle.
	CA string
}

// Secret mounts a broker resource into a container.
type Secret struct {
	Container, Resource, Path string
}

// Result is the init data of one workload of the input.
type Result struct {
	// Doc is the index of the workload's document in the input.
	Doc int
	// Kind, Namespace and Name name the workload.
	Kind, Namespace, Name string
	// InitData is the document; Annotation the value of the pod's
	// io.c8s.initdata annotation (base64 of InitData).
	InitData   []byte
	Annotation string
	// HostData is SNP's (and the sim TEE's) HOST_DATA, MRConfigID TDX's
	// MRCONFIGID, of a VM launched with InitData.
	HostData   [32]byte
	MRConfigID [48]byte
	// Warnings say what the policy could pin only loosely, or what the
	// owner should review.
	Warnings []string
}

// workload is a pod template and how its pods are named.
type workload struct {
	doc                   int
	kind, namespace, name string
	meta                  metav1.ObjectMeta
	spec                  corev1.PodSpec
	// podName is the pattern (without "re:") of the names its pods get.
	podName string
	// exactName is the pod's name when it is known exactly (a Pod).
	exactName string
	// stsService is a StatefulSet's service, its pods' subdomain.
	stsService string
}

// input is a parsed YAML stream.
type input struct {
	workloads  []*workload
	configMaps map[string]*corev1.ConfigMap
	secrets    map[string]*corev1.Secret
	// docs are the raw documents, for Patch.
	docs [][]byte
}

// Generate writes the init data of each workload of the YAML stream data.
func Generate(data []byte, o Options) ([]Result, error) {
	in, err := parseInput(data)
	if err != nil {
		return nil, err
	}
	if len(in.workloads) == 0 {
		return nil, errors.New("the input has no Pod, Deployment, StatefulSet, DaemonSet, ReplicaSet, ReplicationController, Job or CronJob")
	}
	if o.Format == "" {
		o.Format = initdata.FormatC8s
	}
	if o.Format != initdata.FormatC8s && o.Format != initdata.FormatCoCo {
		return nil, fmt.Errorf("format %q: want %s or %s", o.Format, initdata.FormatC8s, initdata.FormatCoCo)
	}
	if o.SandboxImage == "" {
		o.SandboxImage = DefaultSandboxImage
	}
	if o.ClusterDomain == "" {
		o.ClusterDomain = DefaultClusterDomain
	}
	if !validDomain(o.ClusterDomain) {
		return nil, fmt.Errorf("cluster domain %q: want a DNS name of lower-case labels (a-z, 0-9, -) joined by dots, as the kubelet's clusterDomain, e.g. %s", o.ClusterDomain, DefaultClusterDomain)
	}
	var out []Result
	used := map[string]bool{}
	for _, w := range in.workloads {
		g := &gen{o: o, in: in, w: w, used: used}
		r, err := g.result()
		if err != nil {
			return nil, fmt.Errorf("%s %s: %w", w.kind, w.qualified(), err)
		}
		out = append(out, *r)
	}
	for _, k := range append(sortedKeys(o.Images), sortedKeys(o.Layouts)...) {
		if !used[k] {
			out[0].Warnings = append(out[0].Warnings, fmt.Sprintf("--image %s names no container's image, no container and not the sandbox image: unused", k))
		}
	}
	return out, nil
}

func (w *workload) qualified() string {
	if w.namespace == "" {
		return w.name
	}
	return w.namespace + "/" + w.name
}

// result builds, writes and checks one workload's document.
func (g *gen) result() (*Result, error) {
	doc, err := g.document()
	if err != nil {
		return nil, err
	}
	if err := g.check(doc); err != nil {
		return nil, err
	}
	return &Result{
		Doc: g.w.doc, Kind: g.w.kind, Namespace: g.w.namespace, Name: g.w.name,
		InitData: doc, Annotation: base64.StdEncoding.EncodeToString(doc),
		HostData: initdata.Digest(doc), MRConfigID: initdata.DigestTDX(doc),
		Warnings: g.warnings,
	}, nil
}

// parseInput reads the documents of a YAML stream strictly: a field the
// Kubernetes API does not have is an error naming it, so that a typo
// cannot leave something out of the policy.
func parseInput(data []byte) (*input, error) {
	in := &input{configMaps: map[string]*corev1.ConfigMap{}, secrets: map[string]*corev1.Secret{}}
	r := k8syaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	for i := 0; ; i++ {
		doc, err := r.Read()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("read YAML document %d: %w", i+1, err)
		}
		in.docs = append(in.docs, doc)
		if len(bytes.TrimSpace(doc)) == 0 {
			continue
		}
		if err := in.add(len(in.docs)-1, doc); err != nil {
			return nil, fmt.Errorf("YAML document %d: %w", len(in.docs), err)
		}
	}
	return in, nil
}

// add reads one document.
func (in *input) add(i int, doc []byte) error {
	var tm metav1.TypeMeta
	if err := yaml.Unmarshal(doc, &tm); err != nil {
		return err
	}
	if tm.Kind == "" && tm.APIVersion == "" {
		var v any
		if err := yaml.Unmarshal(doc, &v); err == nil && v == nil {
			return nil // only comments
		}
	}
	strict := func(v any) error {
		if err := yaml.UnmarshalStrict(doc, v); err != nil {
			return fmt.Errorf("%s %s: %w", tm.APIVersion, tm.Kind, err)
		}
		return nil
	}
	w := &workload{doc: i, kind: tm.Kind}
	switch tm.APIVersion + " " + tm.Kind {
	case "v1 Pod":
		var p corev1.Pod
		if err := strict(&p); err != nil {
			return err
		}
		w.meta, w.spec = p.ObjectMeta, p.Spec
		w.name, w.namespace = p.Name, p.Namespace
		switch {
		case p.Name != "":
			w.exactName, w.podName = p.Name, regexp.QuoteMeta(p.Name)
		case p.GenerateName != "":
			w.name, w.podName = p.GenerateName, generated(p.GenerateName, "", 0)
		default:
			return errors.New("the Pod has neither metadata.name nor metadata.generateName")
		}
	case "apps/v1 Deployment":
		var d appsv1.Deployment
		if err := strict(&d); err != nil {
			return err
		}
		w.setTemplate(d.ObjectMeta, d.Spec.Template)
		// NAME-HASH-XXXXX: the ReplicaSet's name ends in the template's
		// hash (up to 10 characters), the pod's in 5 random ones.
		w.podName = generated(d.Name+"-", "[a-z0-9]+-", 11)
	case "apps/v1 ReplicaSet":
		var d appsv1.ReplicaSet
		if err := strict(&d); err != nil {
			return err
		}
		w.setTemplate(d.ObjectMeta, d.Spec.Template)
		w.podName = generated(d.Name+"-", "", 0)
	case "apps/v1 DaemonSet":
		var d appsv1.DaemonSet
		if err := strict(&d); err != nil {
			return err
		}
		w.setTemplate(d.ObjectMeta, d.Spec.Template)
		w.podName = generated(d.Name+"-", "", 0)
	case "apps/v1 StatefulSet":
		var d appsv1.StatefulSet
		if err := strict(&d); err != nil {
			return err
		}
		w.setTemplate(d.ObjectMeta, d.Spec.Template)
		w.podName = regexp.QuoteMeta(d.Name) + "-[0-9]+"
		w.stsService = d.Spec.ServiceName
	case "v1 ReplicationController":
		var d corev1.ReplicationController
		if err := strict(&d); err != nil {
			return err
		}
		if d.Spec.Template == nil {
			return errors.New("the ReplicationController has no spec.template")
		}
		w.setTemplate(d.ObjectMeta, *d.Spec.Template)
		w.podName = generated(d.Name+"-", "", 0)
	case "batch/v1 Job":
		var d batchv1.Job
		if err := strict(&d); err != nil {
			return err
		}
		w.setTemplate(d.ObjectMeta, d.Spec.Template)
		// NAME-XXXXX, or NAME-INDEX-XXXXX for an indexed Job.
		w.podName = generated(d.Name+"-", "([0-9]+-)?", 11)
	case "batch/v1 CronJob":
		var d batchv1.CronJob
		if err := strict(&d); err != nil {
			return err
		}
		w.setTemplate(d.ObjectMeta, d.Spec.JobTemplate.Spec.Template)
		// Its Jobs are NAME-MINUTES (the scheduled time).
		w.podName = generated(d.Name+"-", "[0-9]+-([0-9]+-)?", 22)
	case "v1 ConfigMap":
		var c corev1.ConfigMap
		if err := strict(&c); err != nil {
			return err
		}
		in.configMaps[c.Name] = &c
		return nil
	case "v1 Secret":
		var s corev1.Secret
		if err := strict(&s); err != nil {
			return err
		}
		in.secrets[s.Name] = &s
		return nil
	default:
		if isWorkloadKind(tm.Kind) || tm.Kind == "" {
			return fmt.Errorf("apiVersion %q kind %q is not read: write a v1 Pod, an apps/v1 Deployment, StatefulSet, DaemonSet or ReplicaSet, a batch/v1 Job or CronJob, or a v1 ReplicationController", tm.APIVersion, tm.Kind)
		}
		return nil // Services and the like: nothing runs in the pod
	}
	in.workloads = append(in.workloads, w)
	return nil
}

func isWorkloadKind(k string) bool {
	switch k {
	case "Pod", "Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "ReplicationController", "Job", "CronJob", "PodTemplate":
		return true
	}
	return false
}

// setTemplate makes w the workload of a controller with a pod template.
func (w *workload) setTemplate(m metav1.ObjectMeta, t corev1.PodTemplateSpec) {
	w.name, w.namespace = m.Name, m.Namespace
	w.meta, w.spec = t.ObjectMeta, t.Spec
}

// generated is the pattern of a name the API server generates from a
// prefix: base, then what matches rest (at most restMax characters), cut
// to 58 characters, then 5 random ones. A prefix that may be cut is
// matched by its known part.
func generated(base, rest string, restMax int) string {
	const maxPrefix, random = 63 - 5, "[a-z0-9]{5}"
	switch {
	case len(base) >= maxPrefix:
		return regexp.QuoteMeta(base[:maxPrefix]) + random
	case len(base)+restMax > maxPrefix:
		return regexp.QuoteMeta(base) + fmt.Sprintf("[a-z0-9-]{0,%d}", maxPrefix-len(base)) + random
	}
	return regexp.QuoteMeta(base) + rest + random
}
