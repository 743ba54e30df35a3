package prefillshim

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/cockroachdb/errors"

	"github.com/tilert-go/tilert/handoff"
	"github.com/tilert-go/tilert/pd"
)

// SocketVersion is the version of the plugin <-> sidecar socket protocol
// (docs/PROTOCOL.md, "Connector sidecar socket").
const SocketVersion = 1

// Message types on the sidecar socket.
const (
	TypeHello  = "hello"  // both ways: the plugin asks, the sidecar answers with its staging dir
	TypeStage  = "stage"  // plugin -> sidecar: one request's staged state
	TypeQueued = "queued" // sidecar -> plugin: the stage is queued for sending
	TypeError  = "error"  // sidecar -> plugin: the frame was refused
)

// Error codes of an error reply.
const (
	ErrCodeBadFrame     = "bad_frame"     // unreadable frame or JSON, unknown type: the connection closes
	ErrCodeBadRequest   = "bad_request"   // a stage whose fields fail validation
	ErrCodeStagingFull  = "staging_full"  // staged bytes would pass staging_mib
	ErrCodeShuttingDown = "shutting_down" // the sidecar is draining
)

// Hello is the sidecar's answer to the plugin's hello.
type Hello struct {
	Type            string `json:"type"`
	ProtocolVersion int    `json:"protocol_version"`
	StagingDir      string `json:"staging_dir"`
	StagingBytes    int64  `json:"staging_bytes"`
	Transport       string `json:"transport"`
	// IPC: the sidecar can map vLLM's CUDA caches (register_cache,
	// stage_blocks); false: stage through staging_dir only.
	IPC bool `json:"ipc,omitempty"`
}

// StageRegion is one layer cache region inside a staging file: Bytes bytes
// at Offset, the used pages of that region back to back.
type StageRegion struct {
	Layer  int    `json:"layer"`
	Kind   string `json:"kind"` // "mla" | "indexer"
	Offset int64  `json:"offset"`
	Bytes  int64  `json:"bytes"`
}

// Stage is the plugin's message for one claimed request whose state sits
// in the staging file Path. From the moment the sidecar reads it, the file
// is the sidecar's: it deletes it when the request ends, however it ends.
type Stage struct {
	Type            string        `json:"type"`
	RID             string        `json:"rid"`
	Host            string        `json:"tilert_host"`
	CtrlPort        int           `json:"tilert_ctrl_port"`
	Model           string        `json:"model"`
	KVCacheDType    string        `json:"kv_cache_dtype"`
	SeqLen          int           `json:"seq_len"`
	MTPLen          int           `json:"mtp_len"`
	LastPromptToken int           `json:"last_prompt_token"`
	PromptTokenIDs  []int         `json:"prompt_token_ids,omitempty"`
	Path            string        `json:"path"`
	FileBytes       int64         `json:"file_bytes"`
	Regions         []StageRegion `json:"regions"`
}

// Reply is the sidecar's answer to a stage (queued or error).
type Reply struct {
	Type       string `json:"type"`
	RID        string `json:"rid,omitempty"`
	QueueDepth int    `json:"queue_depth,omitempty"`
	Error      string `json:"error,omitempty"`
	Message    string `json:"message,omitempty"`
}

// Ctrl is the decode node's ctrl address.
func (s *Stage) Ctrl() string { return net.JoinHostPort(s.Host, fmt.Sprint(s.CtrlPort)) }

// numLayers counts the distinct layers (the MTP layer included).
func (s *Stage) numLayers() int {
	seen := map[int]bool{}
	for _, r := range s.Regions {
		seen[r.Layer] = true
	}
	return len(seen)
}

// validate checks a stage against the staging dir it must live in. It does
// not open the file (see checkFile).
func (s *Stage) validate(stagingDir string) error {
	if err := s.validateFields(); err != nil {
		return err
	}
	if len(s.Regions) == 0 {
		return errors.New("regions: empty")
	}
	return s.validateRegions(stagingDir)
}

// validateFields checks the fields a stage and a stage_blocks frame share.
func (s *Stage) validateFields() error {
	switch {
	case s.RID == "":
		return errors.New("rid: missing")
	case len(s.RID) > 256:
		return errors.Newf("rid: %d bytes, at most 256", len(s.RID))
	case s.Host == "":
		return errors.New("tilert_host: missing")
	case s.CtrlPort <= 0 || s.CtrlPort > 65535:
		return errors.Newf("tilert_ctrl_port: %d is not a port", s.CtrlPort)
	case s.Model == "":
		return errors.New("model: missing (kv_connector_extra_config.tilert_model)")
	case s.KVCacheDType == "":
		return errors.New("kv_cache_dtype: missing")
	case s.SeqLen <= 0:
		return errors.Newf("seq_len: %d, want > 0", s.SeqLen)
	case s.MTPLen < 0 || s.MTPLen > s.SeqLen:
		// Passed through as the admit's mtp_len; a node drafting with the
		// MTP layer refuses less than seq_len-1 itself (bad_request).
		return errors.Newf("mtp_len: %d, want 0..seq_len %d", s.MTPLen, s.SeqLen)
	case s.LastPromptToken < 0:
		return errors.Newf("last_prompt_token: %d", s.LastPromptToken)
	}
	return nil
}

func (s *Stage) validateRegions(stagingDir string) error {
	if err := checkPath(s.Path, stagingDir); err != nil {
		return err
	}
	pages := int64((s.SeqLen + 63) / 64)
	seen := map[string]bool{}
	perKind := map[string]int64{}
	for i, r := range s.Regions {
		if r.Kind != "mla" && r.Kind != "indexer" {
			return errors.Newf("regions[%d]: kind %q, want mla or indexer", i, r.Kind)
		}
		if r.Layer < 0 {
			return errors.Newf("regions[%d]: layer %d", i, r.Layer)
		}
		name := regionName(r)
		if seen[name] {
			return errors.Newf("regions[%d]: %s listed twice", i, name)
		}
		seen[name] = true
		if r.Offset < 0 || r.Bytes <= 0 || r.Offset+r.Bytes > s.FileBytes || r.Offset+r.Bytes < r.Offset {
			return errors.Newf("regions[%d] %s: [%d, +%d) is outside the %d-byte file", i, name, r.Offset, r.Bytes, s.FileBytes)
		}
		if r.Bytes%pages != 0 {
			return errors.Newf("regions[%d] %s: %d bytes is not %d whole pages (seq_len %d)", i, name, r.Bytes, pages, s.SeqLen)
		}
		if b, ok := perKind[r.Kind]; ok && b != r.Bytes {
			return errors.Newf("regions[%d] %s: %d bytes, other %s regions have %d", i, name, r.Bytes, r.Kind, b)
		}
		perKind[r.Kind] = r.Bytes
	}
	sorted := append([]StageRegion(nil), s.Regions...)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i].Offset < sorted[j].Offset })
	for i := 1; i < len(sorted); i++ {
		if sorted[i-1].Offset+sorted[i-1].Bytes > sorted[i].Offset {
			return errors.Newf("regions %s and %s overlap in the file", regionName(sorted[i-1]), regionName(sorted[i]))
		}
	}
	return nil
}

// checkPath accepts only a plain name directly inside the staging dir, so a
// frame can never make the sidecar read (or delete) any other file.
func checkPath(p, stagingDir string) error {
	if p == "" {
		return errors.New("path: missing")
	}
	if !filepath.IsAbs(p) || filepath.Clean(p) != p || filepath.Dir(p) != stagingDir || strings.HasPrefix(filepath.Base(p), ".") {
		return errors.Newf("path %q is not a file directly inside the staging dir %s", p, stagingDir)
	}
	return nil
}

// checkFile checks that the staging file is a regular file of FileBytes.
func (s *Stage) checkFile() error {
	fi, err := os.Lstat(s.Path)
	if err != nil {
		return errors.Wrapf(err, "staging file %s", s.Path)
	}
	if !fi.Mode().IsRegular() {
		return errors.Newf("staging file %s is not a regular file (%s)", s.Path, fi.Mode().Type())
	}
	if fi.Size() != s.FileBytes {
		return errors.Newf("staging file %s has %d bytes, the stage says %d", s.Path, fi.Size(), s.FileBytes)
	}
	return nil
}

// ordered returns the regions in the decode layout's order: by layer, the
// MLA region before the indexer region.
func (s *Stage) ordered() []StageRegion {
	out := append([]StageRegion(nil), s.Regions...)
	sort.Slice(out, func(i, j int) bool {
		if out[i].Layer != out[j].Layer {
			return out[i].Layer < out[j].Layer
		}
		return out[i].Kind == "mla" && out[j].Kind != "mla"
	})
	return out
}

// regionName is the ctrl protocol's region name of a staged region.
func regionName(r StageRegion) string { return handoff.RegionName(r.Layer, r.Kind) }

// serveConn speaks the socket protocol with one plugin connection until it
// closes or sends a frame the sidecar cannot read.
func (s *Sidecar) serveConn(conn net.Conn) {
	defer conn.Close()
	var cache *mappedCache // this connection's register_cache, if any
	defer func() {
		if cache != nil {
			cache.closeConn()
		}
	}()
	br := bufio.NewReader(conn)
	lim := s.o.Socket
	spoke := false // a first frame has arrived
	reply := func(r any) bool {
		b, _ := json.Marshal(r)
		_ = conn.SetWriteDeadline(time.Now().Add(lim.WriteTimeout))
		return pd.WriteFrame(conn, b) == nil
	}
	for {
		// A new connection must send its first frame within the read
		// timeout (a half-open flood is cut, so the cap cannot be filled
		// for long); after that the plugin's connection may stay idle as
		// long as vLLM is (it carries per-connection state, e.g. the cache
		// registration of the zero-copy path). A started frame must always
		// arrive within the read timeout.
		if spoke {
			_ = conn.SetReadDeadline(time.Time{})
		} else {
			_ = conn.SetReadDeadline(time.Now().Add(lim.ReadTimeout))
		}
		if _, err := br.Peek(1); err != nil {
			return
		}
		spoke = true
		_ = conn.SetReadDeadline(time.Now().Add(lim.ReadTimeout))
		payload, err := pd.ReadFrameLimit(br, lim.MaxFrame, "security.max_frame_bytes")
		if err != nil {
			if errors.Is(err, net.ErrClosed) || isEOF(err) {
				return
			}
			s.badFrame(conn, reply, "", err.Error())
			return
		}
		var head struct {
			Type string `json:"type"`
		}
		if err := json.Unmarshal(payload, &head); err != nil {
			s.badFrame(conn, reply, "", "payload is not a JSON object: "+err.Error())
			return
		}
		switch head.Type {
		case TypeHello:
			if !reply(Hello{Type: TypeHello, ProtocolVersion: SocketVersion, StagingDir: s.o.StagingDir,
				StagingBytes: s.o.StagingBytes, Transport: s.o.Transfer.Kind(), IPC: s.o.Device != nil}) {
				return
			}
		case TypeRegisterCache:
			var rc RegisterCache
			if err := json.Unmarshal(payload, &rc); err != nil {
				s.badFrame(conn, reply, "", "register_cache: "+err.Error())
				return
			}
			m, err := s.registerCache(&rc)
			var r any = Reply{Type: TypeRegistered}
			if err != nil {
				s.m.frames.With(ErrCodeBadRequest).Inc()
				s.o.Log.Error("sidecar: cannot map vLLM's KV cache; the plugin stages through /dev/shm", "err", err)
				r = Reply{Type: TypeError, Error: ErrCodeBadRequest, Message: err.Error()}
			} else {
				if cache != nil {
					cache.closeConn()
				}
				cache = m
				s.o.Log.Info("sidecar: mapped vLLM's KV cache (zero-copy)", "allocations", len(rc.Allocs), "layers", len(rc.Layers))
			}
			if !reply(r) {
				return
			}
		case TypeStageBlocks:
			var sb StageBlocks
			if err := json.Unmarshal(payload, &sb); err != nil {
				s.badFrame(conn, reply, "", "stage_blocks: "+err.Error())
				return
			}
			if !reply(s.enqueueBlocks(cache, &sb)) {
				return
			}
		case TypePoll:
			r := Released{Type: TypeReleased, Released: []string{}}
			if cache != nil {
				r.Released = cache.takeReleased()
			}
			if !reply(r) {
				return
			}
		case TypeStage:
			var st Stage
			if err := json.Unmarshal(payload, &st); err != nil {
				s.badFrame(conn, reply, "", "stage: "+err.Error())
				return
			}
			if !reply(s.enqueue(&st)) {
				return
			}
		default:
			s.badFrame(conn, reply, "", fmt.Sprintf("unknown message type %q", head.Type))
			return
		}
	}
}

func (s *Sidecar) badFrame(conn net.Conn, reply func(any) bool, rid, msg string) {
	s.m.frames.With(ErrCodeBadFrame).Inc()
	s.o.Log.Warn("sidecar: bad frame from the plugin; closing that connection", "remote", conn.RemoteAddr().String(), "err", msg)
	reply(Reply{Type: TypeError, RID: rid, Error: ErrCodeBadFrame, Message: msg})
}

func isEOF(err error) bool { return errors.Is(err, io.EOF) }
