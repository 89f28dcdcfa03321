package bringup

import (
	"bytes"
	"io"
	"os"
	"sync"
)

// ollamaLoadMarker is the line Ollama's scheduler logs once for every
// runner it starts, in v0.6 and v0.17 alike. ("llama runner started in"
// is not: v0.17 waits for a new runner twice and logs it twice per load.)
const ollamaLoadMarker = `msg="loaded runners"`

// lineCounter counts the lines of a growing log that hold a marker,
// reading only what was appended since it last looked: how often the
// managed Ollama loaded a model (ollamaLoadMarker), which is how an
// operator sees that no client's num_ctx made it reload.
type lineCounter struct {
	path   string
	marker []byte

	mu     sync.Mutex
	offset int64
	count  int
	tail   []byte // a partial last line, kept until it ends
}

// newLineCounter counts from the log's end now: what was written before
// (an earlier run's) is not counted.
func newLineCounter(path, marker string) *lineCounter {
	c := &lineCounter{path: path, marker: []byte(marker)}
	if st, err := os.Stat(path); err == nil {
		c.offset = st.Size()
	}
	return c
}

// Count is the number of lines so far that hold the marker; -1 if the log
// cannot be read.
func (c *lineCounter) Count() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	f, err := os.Open(c.path)
	if err != nil {
		return -1
	}
	defer f.Close()
	if st, err := f.Stat(); err == nil && st.Size() < c.offset { // truncated: start over
		c.offset, c.count, c.tail = 0, 0, nil
	}
	if _, err := f.Seek(c.offset, io.SeekStart); err != nil {
		return -1
	}
	b, err := io.ReadAll(io.LimitReader(f, 64<<20))
	if err != nil {
		return -1
	}
	c.offset += int64(len(b))
	b = append(c.tail, b...)
	last := bytes.LastIndexByte(b, '\n')
	c.count += bytes.Count(b[:last+1], c.marker)
	c.tail = append([]byte(nil), b[last+1:]...)
	return c.count
}
