package policy

// ZeroLaunchName is the name of the built-in policy ZeroLaunchDefault: the
// keys of its rules, as denials name them, start with it.
const ZeroLaunchName = "zero-launch-default"

// ZeroLaunchDefault is the policy the agent enforces in a pod VM started
// as snp or tdx (c8s.tee on its measured kernel command line) whose
// launch digest (SNP HOST_DATA, TDX MRCONFIGID) is zero: no init data was
// measured, so nothing pins the workload, and the host that chose it is
// the adversary. The host still chooses what runs (any image, args, env,
// user), but gets no channel into or out of the pod beyond what it had
// to give it:
//
//   - exec: none (an empty exec list);
//   - stdout and stderr: not to the host (logs = false: the guest
//     discards them, as for a no-logs container under a [policy]);
//   - stdin: no writes, to containers or execs;
//   - mounts: the standard ones, tmpfs, emptyDir volumes in guest
//     memory ("emptydir") and the small host files passed by value
//     ("file"); never a bind of a guest path ("guest": the pod's state
//     under /run/c8s, the other containers' roots, /, /dev) nor a host
//     path over virtio-fs ("shared");
//   - containers run unprivileged with containerd's default capabilities,
//     the default masked and read-only paths, their own or the pod
//     sandbox's namespaces (no hostPID, hostNetwork, hostIPC), any
//     sysctl the runtime accepts (it refuses those that are not
//     namespaced), and the default signals;
//   - stats and resource updates: allowed (they tell the host what it
//     sees of the VM from outside).
//
// The agent's other rules of a pod without init data go with it
// (guest/agent): devices are the standard ones only, and port-forward is
// refused. A guest started as sim or without a TEE keeps the allow-all of
// a pod without init data, so that CI and development pods are not
// restricted.
//
// A pod that needs more launches with init data whose [policy] says what
// (c8s-measure policy writes one from the pod's YAML). What this default
// cannot do: since the host chooses the images, a container of its own
// in the pod can still reach what the pod's processes share with it (a
// shared process namespace, the network); only a measured policy pins
// the workload.
func ZeroLaunchDefault() *Policy {
	anywhere := Pattern("re:.*")
	return &Policy{
		Builtin: ZeroLaunchName,
		Default: &Container{
			Image:      anywhere,
			AnyArgs:    true,
			Env:        []Pattern{anywhere},
			WorkingDir: &anywhere,
			AnyUser:    true,
			// Among the pod's own containers: no host content.
			SharePIDNamespace: true,
			Sysctls:           []Pattern{anywhere},
			Mounts: []Mount{
				{Destination: anywhere, Kind: KindTmpfs},
				{Destination: anywhere, Kind: KindEmptyDir},
				{Destination: anywhere, Kind: KindPodShm},
				{Destination: anywhere, Kind: KindFile},
			},
		},
	}
}
