package stage1

import (
	"os"
	"os/exec"
	"strings"
	"testing"
)

// envExecFile makes the test binary, started by TestExecFile, execute the
// file it names through execFile.
const envExecFile = "C8S_STAGE1_TEST_EXECFILE"

func TestMain(m *testing.M) {
	if path := os.Getenv(envExecFile); path != "" {
		f, err := os.Open(path)
		if err != nil {
			os.Stderr.WriteString(err.Error())
			os.Exit(2)
		}
		err = execFile(f, []string{"sh", "-c", `echo "$0 $C8S_X"`}, []string{"C8S_X=from-env"})
		os.Stderr.WriteString("execFile returned: " + err.Error())
		os.Exit(3)
	}
	os.Exit(m.Run())
}

// TestExecFile checks that execFile runs the open file with the given
// argv and environment, and not whatever name it had.
func TestExecFile(t *testing.T) {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(self, "-test.run=^$")
	cmd.Env = append(os.Environ(), envExecFile+"=/bin/sh")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if got := strings.TrimSpace(string(out)); got != "sh from-env" {
		t.Fatalf("the executed file printed %q, want %q", got, "sh from-env")
	}
}

// TestExecFileFails checks that a file that cannot be executed comes back
// as an error rather than a silent return.
func TestExecFileFails(t *testing.T) {
	f, err := os.Open("/etc/hostname")
	if err != nil {
		f, err = os.Open(os.DevNull)
		if err != nil {
			t.Fatal(err)
		}
	}
	defer f.Close()
	if err := execFile(f, []string{"x"}, nil); err == nil {
		t.Fatal("execFile of a non-executable file returned no error")
	}
}
