package main

import (
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"

	"github.com/c8s-dev/c8s/guest/api/initdata"
	policyapi "github.com/c8s-dev/c8s/guest/api/policy"
	"github.com/c8s-dev/c8s/measurements/policygen"
)

func init() {
	register("policy", "a pod's init data with a measured [policy] from its Kubernetes YAML; its annotation, HOST_DATA and MRCONFIGID (see measurements/policygen)", runPolicy)
}

// listFlag is a repeatable flag.
type listFlag []string

func (l *listFlag) String() string     { return strings.Join(*l, ", ") }
func (l *listFlag) Set(v string) error { *l = append(*l, v); return nil }

// policyJSON is one workload's entry of --output-format json.
type policyJSON struct {
	Kind       string            `json:"kind"`
	Namespace  string            `json:"namespace,omitempty"`
	Name       string            `json:"name"`
	Format     string            `json:"format"`
	InitData   string            `json:"initdata"`
	Annotation map[string]string `json:"annotation"`
	HostData   string            `json:"host_data"`
	MRConfigID string            `json:"mrconfigid"`
	Warnings   []string          `json:"warnings"`
}

// runPolicy writes the init data of each workload of a YAML file.
func runPolicy(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("policy", flag.ContinueOnError)
	fs.SetOutput(stderr)
	format := fs.String("format", initdata.FormatC8s, "init data format: c8s, or coco (CoCo's initdata document, c8s's settings in its c8s.toml entry)")
	alg := fs.String("algorithm", "sha384", "digest `ALGORITHM` of a coco document: sha256, sha384 or sha512")
	out := fs.String("o", "", "write the init data document to `FILE` (one workload)")
	patch := fs.String("patch", "", "write the YAML with each workload's pod annotated io.c8s.initdata to `FILE` (- for stdout)")
	outFmt := fs.String("output-format", "text", "what stdout gets: text (a summary), initdata (the document), annotation (its base64) or json")
	sandbox := fs.String("sandbox-image", policygen.DefaultSandboxImage, "the node's sandbox (pause) `IMAGE`, as containerd's config names it")
	clusterDomain := fs.String("cluster-domain", policygen.DefaultClusterDomain, "the cluster's DNS `DOMAIN` (the kubelet's clusterDomain), which ends the FQDN of a pod with setHostnameAsFQDN")
	strict := fs.Bool("strict", false, "refuse images not pinned by digest (NAME@sha256:...), and images whose files are not pinned (--image with the image's layers) unless the guest pulls them (--pull)")
	noLogs := fs.Bool("no-logs", false, "keep every container's stdout and stderr from the host (kubectl logs is refused)")
	audit := fs.Bool("audit", false, "write policy.audit = true: denials are logged, not enforced (bring-up; the owner's broker sees it)")
	kbsURL := fs.String("kbs-url", "", "the key broker's `URL` (https://HOST[:PORT])")
	kbsCert := fs.String("kbs-cert", "", "`PEM` file of the broker's TLS certificate")
	var images, execs, execStdin, secrets, ports, pulls, pullAuths, pullCAs listFlag
	fs.Var(&pulls, "pull", "`CONTAINER` whose image (pinned by digest) the guest may pull and verify itself where the node offers no layer disks (repeatable)")
	fs.Var(&pullAuths, "pull-auth", "`CONTAINER=RESOURCE`: the broker resource (kbs:///REPO/TYPE/TAG) with the registry credentials of CONTAINER's pull (repeatable)")
	fs.Var(&pullCAs, "pull-ca", "`CONTAINER=PEM`: a PEM file of the CA certificates of CONTAINER's registry, the only roots the guest then verifies it against (default: the guest image's public CA bundle) (repeatable)")
	pullHTTP := fs.Bool("pull-plain-http", false, "the guest pulls over plain HTTP (test registries; digests are still verified, the network sees which image; never with --pull-auth)")
	fs.Var(&images, "image", "`REF=LAYOUT`: the OCI image layout (a directory, or a tar of one) of the image the pod names REF, or of container REF; gives entrypoint, cmd, env, working dir and user (repeatable)")
	fs.Var(&execs, "allow-exec", "`CONTAINER=ARGV`: let the host also exec ARGV in CONTAINER (words, or a JSON array; re: elements are patterns) (repeatable)")
	fs.Var(&execStdin, "exec-stdin", "`CONTAINER` whose execs may have stdin or a terminal (kubectl exec -it) (repeatable)")
	fs.Var(&secrets, "secret", "`CONTAINER:RESOURCE:PATH`: mount broker resource RESOURCE (kbs:///REPO/TYPE/TAG) into CONTAINER at PATH (repeatable)")
	fs.Var(&ports, "allow-port-forward", "`PORT` of the pod the host may port-forward to (repeatable)")
	fs.Usage = func() {
		fmt.Fprintf(stderr, "usage: c8s-measure policy [flags] FILE.yaml  (- for stdin)\n\n")
		fs.PrintDefaults()
	}
	var files []string
	for {
		if err := fs.Parse(args); err != nil {
			return err
		}
		if fs.NArg() == 0 {
			break
		}
		files, args = append(files, fs.Arg(0)), fs.Args()[1:]
	}
	if len(files) != 1 {
		fs.Usage()
		return errors.New("want one YAML file (- for stdin)")
	}
	switch *outFmt {
	case "text", "initdata", "annotation", "json":
	default:
		return fmt.Errorf("--output-format %q: want text, initdata, annotation or json", *outFmt)
	}
	if *patch == "-" && *outFmt != "text" {
		return errors.New("--patch - writes the YAML to stdout: --output-format does not apply")
	}
	o := policygen.Options{
		Format: *format, Algorithm: *alg, SandboxImage: *sandbox, ClusterDomain: *clusterDomain, Strict: *strict,
		NoLogs: *noLogs, Audit: *audit, ExecStdin: execStdin,
		KBS:     initdata.KBS{URL: *kbsURL},
		Layouts: map[string]string{}, Exec: map[string][][]policyapi.Pattern{},
	}
	for _, im := range images {
		ref, p, ok := strings.Cut(im, "=")
		if !ok || ref == "" || p == "" {
			return fmt.Errorf("--image %q: want REF=LAYOUT", im)
		}
		o.Layouts[ref] = p
	}
	for _, e := range execs {
		name, argv, err := parseExec(e)
		if err != nil {
			return err
		}
		o.Exec[name] = append(o.Exec[name], argv)
	}
	for _, s := range secrets {
		i, j := strings.Index(s, ":"), strings.LastIndex(s, ":")
		if i <= 0 || j <= i+1 || j == len(s)-1 {
			return fmt.Errorf("--secret %q: want CONTAINER:RESOURCE:PATH", s)
		}
		o.Secrets = append(o.Secrets, policygen.Secret{Container: s[:i], Resource: s[i+1 : j], Path: s[j+1:]})
	}
	for _, n := range pulls {
		if o.Pull == nil {
			o.Pull = map[string]policygen.Pull{}
		}
		o.Pull[n] = policygen.Pull{PlainHTTP: *pullHTTP}
	}
	for _, a := range pullAuths {
		n, res, ok := strings.Cut(a, "=")
		p, pulled := o.Pull[n]
		if !ok || !pulled {
			return fmt.Errorf("--pull-auth %q: want CONTAINER=RESOURCE for a CONTAINER given to --pull", a)
		}
		p.Auth = res
		o.Pull[n] = p
	}
	for _, a := range pullCAs {
		n, file, ok := strings.Cut(a, "=")
		p, pulled := o.Pull[n]
		if !ok || !pulled {
			return fmt.Errorf("--pull-ca %q: want CONTAINER=PEM for a CONTAINER given to --pull", a)
		}
		b, err := os.ReadFile(file)
		if err != nil {
			return fmt.Errorf("--pull-ca %q: %w", a, err)
		}
		p.CA = string(b)
		o.Pull[n] = p
	}
	for _, p := range ports {
		n, err := strconv.ParseUint(p, 10, 16)
		if err != nil || n == 0 {
			return fmt.Errorf("--allow-port-forward %q: want a TCP port (1 to 65535)", p)
		}
		o.PortForward = append(o.PortForward, uint32(n))
	}
	if *kbsCert != "" {
		pem, err := os.ReadFile(*kbsCert)
		if err != nil {
			return err
		}
		o.KBS.Cert = string(pem)
	}
	if (o.KBS.URL == "") != (o.KBS.Cert == "") || len(o.Secrets) > 0 && o.KBS.URL == "" {
		return errors.New("--kbs-url and --kbs-cert go together, and --secret needs both")
	}
	var data []byte
	var err error
	if files[0] == "-" {
		data, err = io.ReadAll(os.Stdin)
	} else {
		data, err = os.ReadFile(files[0])
	}
	if err != nil {
		return err
	}
	results, err := policygen.Generate(data, o)
	if err != nil {
		return err
	}
	for _, r := range results {
		for _, w := range r.Warnings {
			fmt.Fprintf(stderr, "c8s-measure policy: %s %s: warning: %s\n", r.Kind, r.Name, w)
		}
	}
	one := func(what string) (*policygen.Result, error) {
		if len(results) != 1 {
			return nil, fmt.Errorf("%s writes one workload's init data, and the input has %d: split it, or use --patch or --output-format json", what, len(results))
		}
		return &results[0], nil
	}
	if *out != "" {
		r, err := one("-o")
		if err != nil {
			return err
		}
		if err := os.WriteFile(*out, r.InitData, 0o644); err != nil {
			return err
		}
	}
	summary := stdout
	if *patch != "" {
		patched, err := policygen.Patch(data, results)
		if err != nil {
			return err
		}
		if *patch == "-" {
			if _, err := stdout.Write(patched); err != nil {
				return err
			}
			summary = stderr
		} else if err := os.WriteFile(*patch, patched, 0o644); err != nil {
			return err
		}
	}
	switch *outFmt {
	case "text":
		for _, r := range results {
			printPolicySummary(summary, &r, *format, *alg, *out)
		}
		return nil
	case "initdata":
		r, err := one("--output-format initdata")
		if err != nil {
			return err
		}
		_, err = stdout.Write(r.InitData)
		return err
	case "annotation":
		r, err := one("--output-format annotation")
		if err != nil {
			return err
		}
		_, err = fmt.Fprintln(stdout, r.Annotation)
		return err
	case "json":
		var js []policyJSON
		for _, r := range results {
			js = append(js, policyJSON{
				Kind: r.Kind, Namespace: r.Namespace, Name: r.Name, Format: *format,
				InitData: string(r.InitData), Annotation: map[string]string{initdata.Annotation: r.Annotation},
				HostData: hex.EncodeToString(r.HostData[:]), MRConfigID: hex.EncodeToString(r.MRConfigID[:]),
				Warnings: append([]string{}, r.Warnings...),
			})
		}
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(js)
	}
	return nil
}

// parseExec reads --allow-exec CONTAINER=ARGV.
func parseExec(s string) (string, []policyapi.Pattern, error) {
	name, rest, ok := strings.Cut(s, "=")
	if !ok || name == "" {
		return "", nil, fmt.Errorf("--allow-exec %q: want CONTAINER=ARGV", s)
	}
	var argv []string
	if strings.HasPrefix(strings.TrimSpace(rest), "[") {
		if err := json.Unmarshal([]byte(rest), &argv); err != nil {
			return "", nil, fmt.Errorf("--allow-exec %q: %w", s, err)
		}
	} else {
		argv = strings.Fields(rest)
	}
	if len(argv) == 0 {
		return "", nil, fmt.Errorf("--allow-exec %q: an empty argv", s)
	}
	out := make([]policyapi.Pattern, len(argv))
	for i, a := range argv {
		out[i] = policyapi.Pattern(a)
		if err := out[i].Validate(); err != nil {
			return "", nil, fmt.Errorf("--allow-exec %q: %w", s, err)
		}
	}
	return name, out, nil
}

// printPolicySummary prints what an owner needs of one workload's init
// data: the annotation, and the digests for the broker's policy.
func printPolicySummary(w io.Writer, r *policygen.Result, format, alg, out string) {
	name := r.Name
	if r.Namespace != "" {
		name = r.Namespace + "/" + name
	}
	fmt.Fprintf(w, "%s %s\n", r.Kind, name)
	where := "not written (-o FILE, or --output-format initdata)"
	if out != "" {
		where = out
	}
	fmt.Fprintf(w, "  initdata    %s (%s format, %d bytes)\n", where, format, len(r.InitData))
	fmt.Fprintf(w, "  annotation  %s: %s\n", initdata.Annotation, r.Annotation)
	snp, tdx := "SHA-256 of the document", "SHA-384 of the document"
	if format == initdata.FormatCoCo {
		snp, tdx = alg+" of the document, fitted to 32 bytes", alg+" of the document, fitted to 48 bytes"
	}
	fmt.Fprintf(w, "  host_data   %s  (SNP HOST_DATA, sim: %s)\n", hex.EncodeToString(r.HostData[:]), snp)
	fmt.Fprintf(w, "  mrconfigid  %s  (TDX MRCONFIGID: %s)\n", hex.EncodeToString(r.MRConfigID[:]), tdx)
}
