// Package pd is the prefill -> decode handoff's control protocol: frames,
// messages, the decode side's slot table and ctrl server, and the sender's
// client. The data itself moves through an rdma.Engine; this package decides
// when a slot's receive regions are open and to whom. See docs/PROTOCOL.md.
package pd

import (
	"encoding/binary"
	"io"

	"github.com/cockroachdb/errors"
)

// MaxFrame is the largest frame payload, in bytes.
const MaxFrame = 16 << 20

// Frame errors. Every error from ReadFrame/ReadMessage is marked with one of
// these (or is io.EOF on a clean close between frames).
var (
	ErrOversize    = errors.New("pd: frame larger than its limit")
	ErrTruncated   = errors.New("pd: truncated frame")
	ErrEmpty       = errors.New("pd: empty frame")
	ErrInvalidJSON = errors.New("pd: frame is not a UTF-8 JSON object")
	ErrUnknownType = errors.New("pd: unknown message type")
	ErrBadMessage  = errors.New("pd: malformed message")
)

// PreAuthMaxFrame caps frames a ctrl server reads before the peer has
// authenticated (the auth message is ~150 bytes).
const PreAuthMaxFrame = 4096

// growStep is how much of a large frame is allocated ahead of the bytes
// that have arrived: a peer that claims 16 MiB and sends 10 bytes holds
// 64 KiB, not 16 MiB.
const growStep = 64 << 10

// ReadFrame reads one frame: a 4-byte big-endian length, then that many
// bytes. It returns io.EOF only when the stream ends cleanly before a frame.
// The payload is freshly allocated (its size is checked before allocation).
func ReadFrame(r io.Reader) ([]byte, error) { return ReadFrameLimit(r, MaxFrame, "") }

// ReadFrameLimit is ReadFrame with a smaller limit for the messages the
// reader expects now; limitName (a config key) is named in the error. The
// length is checked before anything is allocated, and the payload buffer
// grows only as its bytes arrive.
func ReadFrameLimit(r io.Reader, limit int, limitName string) ([]byte, error) {
	if limit <= 0 || limit > MaxFrame {
		limit = MaxFrame
	}
	var hdr [4]byte
	if n, err := io.ReadFull(r, hdr[:]); err != nil {
		if err == io.EOF && n == 0 {
			return nil, io.EOF
		}
		return nil, errors.Mark(errors.Wrapf(err, "pd: frame length (%d of 4 bytes)", n), ErrTruncated)
	}
	size := binary.BigEndian.Uint32(hdr[:])
	if uint64(size) > uint64(limit) {
		what := ""
		if limitName != "" {
			what = " (" + limitName + ")"
		}
		return nil, errors.Mark(errors.Newf("pd: frame of %d bytes exceeds the %d-byte limit%s", size, limit, what), ErrOversize)
	}
	if size == 0 {
		return nil, ErrEmpty
	}
	buf := make([]byte, 0, min(int(size), growStep))
	for len(buf) < int(size) {
		if len(buf) == cap(buf) { // double, at most to the frame's size
			nb := make([]byte, len(buf), len(buf)+min(int(size)-len(buf), max(growStep, len(buf))))
			copy(nb, buf)
			buf = nb
		}
		n, err := io.ReadFull(r, buf[len(buf):min(int(size), cap(buf))])
		buf = buf[:len(buf)+n]
		if err != nil {
			return nil, errors.Mark(errors.Wrapf(err, "pd: frame body (%d of %d bytes)", len(buf), size), ErrTruncated)
		}
	}
	return buf, nil
}

// WriteFrame writes payload as one frame with a single Write call, so
// concurrent writers that serialise on the writer never interleave.
func WriteFrame(w io.Writer, payload []byte) error {
	if len(payload) > MaxFrame {
		return errors.Mark(errors.Newf("pd: frame of %d bytes exceeds the %d-byte limit", len(payload), MaxFrame), ErrOversize)
	}
	if len(payload) == 0 {
		return ErrEmpty
	}
	buf := make([]byte, 4+len(payload))
	binary.BigEndian.PutUint32(buf, uint32(len(payload)))
	copy(buf[4:], payload)
	_, err := w.Write(buf)
	return errors.Wrap(err, "pd: write frame")
}

// ReadMessage reads and decodes one frame.
func ReadMessage(r io.Reader) (Message, error) { return ReadMessageLimit(r, MaxFrame, "") }

// ReadMessageLimit reads and decodes one frame of at most limit bytes.
func ReadMessageLimit(r io.Reader, limit int, limitName string) (Message, error) {
	b, err := ReadFrameLimit(r, limit, limitName)
	if err != nil {
		return nil, err
	}
	return Decode(b)
}

// WriteMessage encodes m and writes it as one frame.
func WriteMessage(w io.Writer, m Message) error {
	b, err := Encode(m)
	if err != nil {
		return err
	}
	return WriteFrame(w, b)
}
