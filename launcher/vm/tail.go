package vm

import (
	"bytes"
	"os"
	"strings"
	"sync"
)

// tailBuffer keeps the last max bytes written to it.
type tailBuffer struct {
	mu  sync.Mutex
	max int
	buf []byte
}

func newTailBuffer(max int) *tailBuffer { return &tailBuffer{max: max} }

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.buf = append(t.buf, p...)
	if over := len(t.buf) - t.max; over > 0 {
		t.buf = append(t.buf[:0], t.buf[over:]...)
	}
	return len(p), nil
}

// Tail returns the last n lines.
func (t *tailBuffer) Tail(n int) string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return lastLines(t.buf, n)
}

func lastLines(b []byte, n int) string {
	b = bytes.TrimRight(b, "\r\n")
	lines := strings.Split(string(b), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// fileTail returns the last n lines of a file's last 16 KiB ("" on error).
func fileTail(path string, n int) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	const window = 16 << 10
	if st, err := f.Stat(); err == nil && st.Size() > window {
		_, _ = f.Seek(st.Size()-window, 0)
	}
	b := make([]byte, window)
	m, _ := f.Read(b)
	return lastLines(b[:m], n)
}
