package e2e

import (
	"context"
	"errors"
	"syscall"
	"testing"
	"time"

	runtimeoptions "github.com/containerd/containerd/api/types/runtimeoptions/v1"
	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/pkg/cio"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/containerd/v2/pkg/oci"
	"github.com/containerd/errdefs"
)

// exitLimit bounds how long an exit may take to arrive once the shim was
// asked for it (a guard against the hang, not a benchmark).
const exitLimit = 30 * time.Second

// TestShimAPICreatedTaskExits drives the shim through containerd's Go
// client as containerd's own client tests do: a task that is created but
// never started exits at once on Kill(SIGKILL), and a second one on
// Delete(WithProcessKill); Pids works on a created task; a second kill of
// an exited task is NotFound, as with runc's shim. All containers share
// one pod VM.
func TestShimAPICreatedTaskExits(t *testing.T) {
	e := setup(t)
	ctx, cancel := context.WithTimeout(namespaces.WithNamespace(context.Background(), e.d.Namespace), 5*time.Minute)
	defer cancel()
	client, err := containerd.New(e.d.Address)
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	img, err := client.GetImage(ctx, image)
	if err != nil {
		t.Fatal(err)
	}
	const pod = "shimapi-pod"
	newTask := func(t *testing.T, id string, args ...string) (containerd.Container, containerd.Task) {
		t.Helper()
		c, err := client.NewContainer(ctx, id,
			containerd.WithImage(img),
			containerd.WithNewSnapshot(id+"-snap", img),
			containerd.WithRuntime(runtimeType, &runtimeoptions.Options{ConfigPath: e.config}),
			containerd.WithNewSpec(oci.WithImageConfig(img), oci.WithProcessArgs(args...),
				oci.WithAnnotations(map[string]string{"io.kubernetes.cri.sandbox-id": pod})),
		)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Delete(context.WithoutCancel(ctx), containerd.WithSnapshotCleanup) })
		task, err := c.NewTask(ctx, cio.NullIO)
		if err != nil {
			t.Fatalf("NewTask %s: %v\n%s", id, err, e.d.Log())
		}
		return c, task
	}

	// The pod's first container keeps the VM up while the others come and go.
	_, sandbox := newTask(t, pod, "sleep", "600")
	if err := sandbox.Start(ctx); err != nil {
		t.Fatal(err)
	}

	t.Run("kill", func(t *testing.T) {
		_, task := newTask(t, "created-kill", "sleep", "600")
		pids, err := task.Pids(ctx)
		if err != nil || len(pids) != 1 || pids[0].Pid != task.Pid() {
			t.Errorf("Pids of a created task = %v, %v; want just its init %d", pids, err, task.Pid())
		}
		exited, err := task.Wait(ctx)
		if err != nil {
			t.Fatal(err)
		}
		t0 := time.Now()
		if err := task.Kill(ctx, syscall.SIGKILL); err != nil {
			t.Fatalf("Kill(SIGKILL) of a created task: %v", err)
		}
		select {
		case st := <-exited:
			t.Logf("created task exited %d after %s", st.ExitCode(), time.Since(t0).Round(time.Millisecond))
			if code := st.ExitCode(); code != 128+9 {
				t.Errorf("exit status %d, want 137", code)
			}
		case <-time.After(exitLimit):
			t.Fatalf("no exit %s after Kill(SIGKILL) of a created task\n%s", exitLimit, e.d.Log())
		}
		if err := task.Kill(ctx, syscall.SIGTERM); !errors.Is(err, errdefs.ErrNotFound) {
			t.Errorf("second kill of an exited task: %v, want NotFound", err)
		}
		if _, err := task.Delete(ctx); err != nil {
			t.Fatalf("Delete after the exit: %v", err)
		}
	})

	t.Run("delete-with-process-kill", func(t *testing.T) {
		_, task := newTask(t, "created-delete", "sleep", "600")
		done := make(chan error, 1)
		go func() {
			_, err := task.Delete(ctx, containerd.WithProcessKill)
			done <- err
		}()
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("Delete(WithProcessKill) of a created task: %v", err)
			}
		case <-time.After(exitLimit):
			t.Fatalf("Delete(WithProcessKill) of a created task did not return in %s\n%s", exitLimit, e.d.Log())
		}
	})

	if err := sandbox.Kill(ctx, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if _, err := sandbox.Delete(ctx, containerd.WithProcessKill); err != nil {
		t.Fatal(err)
	}
	e.assertNothingLeft(t)
}
