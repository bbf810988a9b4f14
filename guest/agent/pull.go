package agent

import (
	"context"
	"crypto/sha256"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	"github.com/google/go-containerregistry/pkg/authn"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	agentapi "github.com/c8s-dev/c8s/guest/api/agent/v1"
	"github.com/c8s-dev/c8s/guest/api/initdata"
	kbsapi "github.com/c8s-dev/c8s/guest/api/kbs"
	policyapi "github.com/c8s-dev/c8s/guest/api/policy"
	"github.com/c8s-dev/c8s/guest/kbs"
	"github.com/c8s-dev/c8s/guest/mesh"
	"github.com/c8s-dev/c8s/guest/policy"
	"github.com/c8s-dev/c8s/guest/pull"
)

// Guest pull (guest/pull): a container whose rule names a digest-pinned
// image (policy pull = "…@sha256:…") and for which the host offers no
// root (neither a disk nor layers) gets the image the guest pulls itself,
// through the pod's network, verifying every digest as it streams. The
// reference is the policy's; the host only chose not to offer disks.
//
//   - Where: a tmpfs of its own at ImagesDir (guest memory, encrypted by
//     SNP and TDX, like the containers' writable layers), mounted
//     nodev,nosuid on the first pull, one directory per manifest digest
//     (guest/pull), which every container of that image in the pod
//     stacks under its own writable tmpfs layer (stackRoot). A pulled
//     image stays for the pod VM's life: a restarted container starts
//     without pulling again.
//   - When: as soon as the pod network is up (the sandbox container is
//     created and its network configured: startPulls), for every rule of
//     the policy that names an image, so that the pull overlaps the
//     kubelet's next steps; else at the container's create.
//   - How long: CreateContainer waits up to PullWait for the pull, then
//     fails Unavailable with its progress ("pulling …: 312 of 900 MiB"),
//     which the kubelet retries while the pull goes on. A pull that fails
//     leaves nothing (the image's partial directory is removed); its
//     error is returned to the create that finds it, and the next create
//     pulls again.
//   - Credentials: from the pod's key broker (pull_auth), through the
//     same attested KBS handshake as [kbs] secrets, when the pull needs
//     them (pullOnlyCredentials: not with the pod's secrets), kept in
//     memory for that pull only; never from the host, never over plain
//     HTTP.
//   - TLS: the registry is verified against the rule's pull_ca, else the
//     sealed image's public CA bundle, and nothing else (pullRoots).
//   - Network: the pull's sockets are opened in the sandbox container's
//     network namespace (the pod's). The registry is named by address:
//     names are resolved by the guest's resolver, not the pod's DNS.

// DefaultPullWait is Config.PullWait unless set: how long a
// CreateContainer waits for its image's pull before it reports progress.
const DefaultPullWait = 60 * time.Second

// pullProgressEvery is how often a running pull is logged.
const pullProgressEvery = 10 * time.Second

// pullJob is one image being pulled, or pulled.
type pullJob struct {
	img   policy.PullImage
	done  chan struct{}
	dir   string // the unpacked image, once done without error
	err   error
	bytes atomic.Int64
	total atomic.Int64
	start time.Time
}

func (j *pullJob) progress() string {
	return pull.Progress{Done: j.bytes.Load(), Total: j.total.Load()}.String()
}

// pullStore holds the pod's pulls, by reference.
type pullStore struct {
	mu      sync.Mutex
	jobs    map[string]*pullJob
	mounted bool
	// broker fetches pull_auth credentials (SetInitData: setPullBroker).
	broker *kbs.Client
}

// setPullBroker keeps the pod's key broker for pull_auth credentials.
func (s *Service) setPullBroker(doc *initdata.InitData, raw []byte, tee string) {
	k := doc.KBS
	if k.URL == "" || (tee != kbsapi.TeeSNP && tee != kbsapi.TeeTDX) {
		return
	}
	roots, err := k.CertPool()
	if err != nil {
		return
	}
	s.pulls.mu.Lock()
	s.pulls.broker = &kbs.Client{URL: k.URL, Roots: roots, Dial: s.cfg.KBSDial, Tee: tee, InitData: raw, Evidence: s.kbsEvidence}
	s.pulls.mu.Unlock()
}

func (s *Service) imagesDir() string {
	if s.cfg.ImagesDir != "" {
		return s.cfg.ImagesDir
	}
	return filepath.Join(filepath.Dir(filepath.Clean(s.cfg.StateDir)), "images")
}

func (s *Service) pullWait() time.Duration {
	if s.cfg.PullWait > 0 {
		return s.cfg.PullWait
	}
	return DefaultPullWait
}

// startPulls starts the pulls of every image the pod's policy has the
// guest pull, in the network namespace of sandbox container c, whose
// network the host has just configured.
func (s *Service) startPulls(ctx context.Context, c *container) {
	imgs := s.evaluator().PullImages()
	if len(imgs) == 0 {
		return
	}
	for _, img := range imgs {
		s.pullFor(ctx, img, c)
	}
}

// sandboxOf returns the sandbox container c joins (c itself if it is one),
// or nil.
func (s *Service) sandboxOf(c *container) *container {
	id := c.sandboxID
	if id == "" {
		id = c.id
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.containers[id]
}

// netnsOf returns a copy of the network namespace sandbox sc holds, or
// nil (the VM's own namespace) without a sandbox. A sandbox being removed
// has none to give: the pull is not run in the VM's instead.
func netnsOf(sc *container) (*os.File, error) {
	if sc == nil {
		return nil, nil
	}
	sc.mu.Lock()
	defer sc.mu.Unlock()
	if sc.removing {
		return nil, fmt.Errorf("the pod's sandbox %q is being removed: %w", sc.id, errdefs.ErrFailedPrecondition)
	}
	f := sc.ns[specs.NetworkNamespace]
	if f == nil {
		return nil, nil
	}
	fd, err := unix.FcntlInt(f.Fd(), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("copy the network namespace of sandbox %q: %w", sc.id, err)
	}
	return os.NewFile(uintptr(fd), f.Name()), nil
}

// pullKey tells pulls apart: two rules may name one image with other
// credentials or roots, and neither pull may stand for the other (one
// rule's credentials must not open the image to another's container).
func pullKey(img policy.PullImage) string {
	return fmt.Sprintf("%s auth=%q plain_http=%t ca=%x", img.Ref, img.Auth, img.PlainHTTP, sha256.Sum256([]byte(img.CA)))
}

// pullFor returns the pull of img, starting it in sandbox sc's network
// if there is none yet. A failed pull is returned once and forgotten.
func (s *Service) pullFor(ctx context.Context, img policy.PullImage, sc *container) *pullJob {
	key := pullKey(img)
	st := &s.pulls
	st.mu.Lock()
	defer st.mu.Unlock()
	if j := st.jobs[key]; j != nil {
		return j
	}
	if st.jobs == nil {
		st.jobs = map[string]*pullJob{}
	}
	j := &pullJob{img: img, done: make(chan struct{}), start: time.Now()}
	st.jobs[key] = j
	netns, err := netnsOf(sc)
	if err != nil {
		j.err = err
		close(j.done)
		return j
	}
	ctx = log.WithLogger(context.WithoutCancel(ctx), log.G(ctx).WithField("image", key))
	go s.runPull(ctx, j, netns)
	return j
}

func (s *Service) runPull(ctx context.Context, j *pullJob, netns *os.File) {
	defer close(j.done)
	if netns != nil {
		defer netns.Close()
	}
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		t := time.NewTicker(pullProgressEvery)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
				log.G(ctx).WithField("progress", j.progress()).Info("pulling the image")
			}
		}
	}()
	log.G(ctx).WithField("plain_http", j.img.PlainHTTP).WithField("auth", j.img.Auth != "").Info("pulling the image in the guest")
	dir, err := s.pullImage(ctx, j, netns)
	if err != nil {
		j.err = err
		log.G(ctx).WithError(err).WithField("progress", j.progress()).Error("guest pull failed")
		return
	}
	j.dir = dir
	log.G(ctx).WithField("took", time.Since(j.start).Round(time.Millisecond)).WithField("bytes", j.total.Load()).Info("image pulled and verified")
}

func (s *Service) pullImage(ctx context.Context, j *pullJob, netns *os.File) (string, error) {
	tr := netnsTransport(netns)
	// No connection outlives the pull in the pod's namespace.
	defer tr.CloseIdleConnections()
	o := pull.Options{
		PlainHTTP: j.img.PlainHTTP,
		Transport: tr,
		Progress: func(p pull.Progress) {
			j.bytes.Store(p.Done)
			j.total.Store(p.Total)
		},
	}
	if !j.img.PlainHTTP {
		roots, err := pullRoots(j.img)
		if err != nil {
			return "", err
		}
		o.Roots = roots
	}
	if j.img.Auth != "" {
		auth, err := s.pullCredentials(ctx, j.img)
		if err != nil {
			return "", err
		}
		o.Auth = auth
	}
	dir := s.imagesDir()
	if err := s.mountImages(dir); err != nil {
		return "", err
	}
	img, err := pull.Pull(ctx, j.img.Ref, dir, o)
	if err != nil {
		return "", err
	}
	return img.Dir, nil
}

// pullCABundle is the public CA bundle of the sealed guest image
// (images/build.sh: Debian's ca-certificates), measured with the image.
var pullCABundle = "/etc/ssl/certs/ca-certificates.crt"

// pullRoots are the only roots img's registry certificate is verified
// against: the rule's pull_ca (measured with the policy), else the guest
// image's public bundle. Never the host's, and there is no fallback to
// an unverified connection.
func pullRoots(img policy.PullImage) (*x509.CertPool, error) {
	pool := x509.NewCertPool()
	if img.CA != "" {
		certs, err := policyapi.ParsePullCA(img.CA)
		if err != nil {
			return nil, fmt.Errorf("pull %s: pull_ca: %w: %w", img.Ref, err, errdefs.ErrInvalidArgument)
		}
		for _, c := range certs {
			pool.AddCert(c)
		}
		return pool, nil
	}
	b, err := os.ReadFile(pullCABundle)
	if err != nil || !pool.AppendCertsFromPEM(b) {
		return nil, fmt.Errorf("pull %s over HTTPS: the guest image has no CA bundle (%s) to verify the registry against, and the rule names no pull_ca: name the registry's CA in pull_ca: %w", img.Ref, pullCABundle, errdefs.ErrFailedPrecondition)
	}
	return pool, nil
}

// pullOnlyCredentials are the [[kbs.secrets]] resources that only rules'
// pull_auth name (no rule mounts them as a secret): the pull fetches
// them from the broker when it needs them, so they are never kept on the
// secrets tmpfs, and a broker that refuses one fails that pull, naming
// the resource, not the pod.
func pullOnlyCredentials(doc *initdata.InitData) map[string]bool {
	if doc.Policy == nil {
		return nil
	}
	auth, mounted := map[string]bool{}, map[string]bool{}
	rules := make([]*policyapi.Container, 0, len(doc.Policy.Containers)+1)
	rules = append(rules, doc.Policy.Sandbox)
	for _, r := range doc.Policy.Containers {
		rules = append(rules, r)
	}
	for _, r := range rules {
		if r == nil {
			continue
		}
		if r.PullAuth != "" {
			if p, err := (initdata.Secret{Resource: r.PullAuth}).ResourcePath(); err == nil {
				auth[p] = true
			}
		}
		for _, sec := range r.Secrets {
			if p, err := (initdata.Secret{Resource: sec.Resource}).ResourcePath(); err == nil {
				mounted[p] = true
			}
		}
	}
	for p := range mounted {
		delete(auth, p)
	}
	return auth
}

// pullCredentials fetches the registry's credentials from the pod's key
// broker.
func (s *Service) pullCredentials(ctx context.Context, img policy.PullImage) (*authn.AuthConfig, error) {
	s.pulls.mu.Lock()
	b := s.pulls.broker
	s.pulls.mu.Unlock()
	if b == nil {
		return nil, fmt.Errorf("pull %s: pull_auth %q: the pod's init data names no key broker (kbs.url) the guest attests to: %w", img.Ref, img.Auth, errdefs.ErrFailedPrecondition)
	}
	path, err := initdata.Secret{Resource: img.Auth}.ResourcePath()
	if err != nil {
		return nil, err
	}
	vals, err := b.FetchRetry(ctx, []string{path}, secretRetry)
	if err != nil {
		return nil, fmt.Errorf("pull %s: registry credentials %s from the key broker: %w: %w", img.Ref, img.Auth, err, errdefs.ErrPermissionDenied)
	}
	defer clear(vals[0])
	return pull.ParseCredentials(vals[0], img.Ref.Registry)
}

// mountImages mounts the tmpfs pulled images are kept in, once: in guest
// memory, nodev and nosuid (as layer disks are mounted). Outside a TEE
// guest (tests) it is a directory.
func (s *Service) mountImages(dir string) error {
	s.pulls.mu.Lock()
	defer s.pulls.mu.Unlock()
	if s.pulls.mounted {
		return nil
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	if s.confidentialWrites() {
		size := s.cfg.ScratchSize
		if size == "" {
			size = DefaultScratchSize
		}
		if err := unix.Mount("c8s-images", dir, "tmpfs", unix.MS_NODEV|unix.MS_NOSUID, "mode=0700,size="+size); err != nil {
			return fmt.Errorf("mount the tmpfs of pulled images on %s (size=%s): %w", dir, size, err)
		}
	}
	s.pulls.mounted = true
	return nil
}

// netnsTransport is an HTTP transport whose connections are opened in the
// network namespace netns (nil: the agent's own).
func netnsTransport(netns *os.File) *http.Transport {
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.Proxy = nil // the host sets no proxy of ours
	if netns != nil {
		t.DialContext = netnsDialer(netns)
	}
	return t
}

// pullNameserver is the nameserver netnsDialer's resolver (a guest pull's,
// the mesh CA client's) queries for the one resolv.conf names (tests point
// it at their own).
var pullNameserver = func(addr string) string { return addr }

// netnsDialer dials from a thread that entered netns: the socket is
// created there. The thread is never given back to the scheduler (the
// goroutine ends locked), so no other goroutine runs in the pod's
// namespace. Go's dialer would race IPv4 and IPv6 attempts on goroutines
// of their own, and its resolver queries A and AAAA so too: on threads in
// the VM's own namespace, where the host could answer a name with a
// loopback address of the VM's. So the attempts are made one after the
// other (FallbackDelay -1), the resolver dials each query in the pod's
// namespace too, and every socket is checked to be there before it
// connects.
func netnsDialer(netns *os.File) func(ctx context.Context, network, addr string) (net.Conn, error) {
	var st unix.Stat_t
	nsErr := unix.Fstat(int(netns.Fd()), &st)
	inPodNS := func(network, addr string, c syscall.RawConn) error {
		if nsErr != nil {
			return fmt.Errorf("the pod's network namespace: %w", nsErr)
		}
		var cur unix.Stat_t
		if err := unix.Stat("/proc/thread-self/ns/net", &cur); err != nil {
			return fmt.Errorf("this thread's network namespace: %w", err)
		}
		if cur.Ino != st.Ino || cur.Dev != st.Dev {
			return errors.New("a socket of the agent's outside the pod's network namespace")
		}
		// The agent's own connection: the pod's mesh neither redirects
		// nor, with unmeshed = "refuse", drops it (guest/mesh Rules).
		return mesh.MarkControl(network, addr, c)
	}
	// within runs dial on a locked thread in netns.
	within := func(ctx context.Context, dial func(ctx context.Context) (net.Conn, error)) (net.Conn, error) {
		type result struct {
			c   net.Conn
			err error
		}
		ch := make(chan result, 1)
		go func() {
			runtime.LockOSThread()
			if err := unix.Setns(int(netns.Fd()), unix.CLONE_NEWNET); err != nil {
				ch <- result{nil, fmt.Errorf("enter the pod's network namespace: %w", err)}
				return
			}
			c, err := dial(ctx)
			ch <- result{c, err}
		}()
		r := <-ch
		return r.c, r.err
	}
	resolver := &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, network, addr string) (net.Conn, error) {
		return within(ctx, func(ctx context.Context) (net.Conn, error) {
			d := net.Dialer{FallbackDelay: -1, Control: inPodNS}
			return d.DialContext(ctx, network, pullNameserver(addr))
		})
	}}
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		return within(ctx, func(ctx context.Context) (net.Conn, error) {
			d := net.Dialer{FallbackDelay: -1, Resolver: resolver, Control: inPodNS}
			return d.DialContext(ctx, network, addr)
		})
	}
}

// pulledRoot mounts container c's root from the image its rule has the
// guest pull: waits for the pull (waitPull), then stacks the container's
// writable layer over the image.
func (s *Service) pulledRoot(ctx context.Context, c *container, spec *specs.Spec) error {
	img, ok := c.policy().PullImage()
	if !ok {
		return fmt.Errorf("container %q: the host offered no root (neither a disk nor layers), and no policy rule names an image for the guest to pull: %w", c.id, errdefs.ErrInvalidArgument)
	}
	dir, err := s.waitPull(ctx, c.id, img, s.sandboxOf(c))
	if err != nil {
		return err
	}
	return s.stackRoot(ctx, c, []string{dir}, spec, nil)
}

// waitPull waits up to PullWait for the pull of img (started in sandbox
// sc's network if it is not yet) and returns the image's directory. A
// pull still running is reported Unavailable with its progress, for the
// kubelet to retry; a failed one with its error (DataLoss for content
// that does not verify), once: the next call pulls again.
func (s *Service) waitPull(ctx context.Context, id string, img policy.PullImage, sc *container) (string, error) {
	j := s.pullFor(ctx, img, sc)
	t := time.NewTimer(s.pullWait())
	defer t.Stop()
	select {
	case <-j.done:
	case <-t.C:
		return "", fmt.Errorf("container %q: pulling %s: %s (after %s; the pull goes on, retry): %w", id, img.Ref, j.progress(), time.Since(j.start).Round(time.Second), errdefs.ErrUnavailable)
	case <-ctx.Done():
		return "", fmt.Errorf("container %q: pulling %s: %s: %w", id, img.Ref, j.progress(), ctx.Err())
	}
	if j.err == nil {
		return j.dir, nil
	}
	s.pulls.mu.Lock()
	if s.pulls.jobs[pullKey(img)] == j {
		delete(s.pulls.jobs, pullKey(img))
	}
	s.pulls.mu.Unlock()
	var de *pull.DigestError
	switch {
	case errors.As(j.err, &de):
		return "", fmt.Errorf("container %q: %w: %w", id, j.err, errdefs.ErrDataLoss)
	case errdefs.IsFailedPrecondition(j.err), errdefs.IsPermissionDenied(j.err):
		return "", fmt.Errorf("container %q: %w", id, j.err) // the broker's answer, or its absence
	}
	// The registry or the network: another pull may succeed.
	return "", fmt.Errorf("container %q: %w: %w", id, j.err, errdefs.ErrUnavailable)
}

// emptyRoot reports whether the host offered no root at all: no disk, no
// layers, no file system type or options. The guest then pulls the image
// the container's rule names (pulledRoot), or the policy refuses.
func emptyRoot(r *agentapi.Rootfs) bool {
	return r.GetSource() == nil && len(r.GetLayers()) == 0 && r.GetFstype() == "" && len(r.GetOptions()) == 0
}
