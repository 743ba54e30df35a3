package pd

import (
	"bytes"
	"encoding/json"
	"unicode/utf8"

	"github.com/cockroachdb/errors"

	"github.com/tilert-go/tilert/rdma"
)

// Magic identifies a TileRT ctrl port in hello and admit.
const Magic = "tilert-pd"

// ProtocolVersion is the ctrl protocol version this package speaks.
// 2: hello carries auth/nonce/session and the auth message exists (an
// HMAC challenge-response before any admission).
const ProtocolVersion = 2

// Auth schemes in hello.auth.
const (
	AuthNone = "none"        // the node has no secret: no challenge
	AuthHMAC = "hmac-sha256" // the peer must prove the shared secret first
)

// Message types, the "type" field of every frame.
const (
	TypeHello  = "hello"
	TypeAdmit  = "admit"
	TypeAccept = "accept"
	TypeReject = "reject"
	TypeDone   = "done"
	TypeAck    = "ack"
	TypeError  = "error"
	TypeAuth   = "auth"
)

// Reject reasons (Reject.Error).
const (
	ReasonBusy           = "busy"
	ReasonTooLong        = "too_long"
	ReasonLayoutMismatch = "layout_mismatch"
	ReasonCancelling     = "cancelling"
	ReasonBadRequest     = "bad_request"
)

// Ack errors (Ack.Error when OK is false).
const (
	AckStale            = "stale"             // no reservation for this rid+slot+generation: expired, duplicate or never accepted
	AckSizeMismatch     = "size_mismatch"     // done.bytes differs from the admitted sizes
	AckChecksumMismatch = "checksum_mismatch" // the landed bytes do not match done.checksum
)

// Message is one ctrl frame's content.
type Message interface {
	Type() string
	validate() error
}

// Transport names the decode node's transfer engine and how to reach it.
type Transport struct {
	Kind     string `json:"kind"`     // "tcp" | "nixl"
	Endpoint string `json:"endpoint"` // rdma.Engine.Endpoint()
}

// RegionCap is a receive region's per-slot capacity, announced in hello.
type RegionCap struct {
	Name     string `json:"name"`
	Capacity int64  `json:"capacity"`
}

// Hello is the server's first frame on every ctrl connection.
type Hello struct {
	Magic           string      `json:"magic"`
	ProtocolVersion int         `json:"protocol_version"`
	Model           string      `json:"model"`
	LayoutVersion   int         `json:"layout_version"`
	KVCacheDType    string      `json:"kv_cache_dtype"`
	NumLayers       int         `json:"num_layers"`
	MaxSeqLen       int         `json:"max_seq_len"`
	Transport       Transport   `json:"transport"`
	Slots           int         `json:"slots"`
	Busy            int         `json:"busy"`
	Regions         []RegionCap `json:"regions"`
	// Auth is the node's scheme: AuthNone, or AuthHMAC, when the first
	// hello is only a challenge (magic, version, auth, nonce) and the full
	// hello follows a good auth message, carrying MAC and Session.
	Auth  string `json:"auth,omitempty"`
	Nonce []byte `json:"nonce,omitempty"` // the server's challenge (32 bytes, base64 in JSON)
	// MAC proves the node holds the secret too: HMAC-SHA256(secret,
	// "tilert-pd v2 server", server nonce, client nonce, session).
	MAC []byte `json:"mac,omitempty"`
	// Session names this ctrl connection; the transfer streams a client
	// opens carry it, and an accept's write key is good only on them.
	Session string `json:"session,omitempty"`
}

// Challenge says whether h is the first, challenge-only hello of an
// authenticating node.
func (h *Hello) Challenge() bool { return h.Auth == AuthHMAC && h.MAC == nil }

// AuthMsg answers a challenge: the client's own nonce and
// HMAC-SHA256(secret, "tilert-pd v2 client", server nonce, client nonce).
type AuthMsg struct {
	Nonce []byte `json:"nonce"`
	MAC   []byte `json:"mac"`
}

// Layout is the part of hello and admit that must match exactly for a
// request's state to be usable by the decode node.
type Layout struct {
	Model         string `json:"model"`
	LayoutVersion int    `json:"layout_version"`
	KVCacheDType  string `json:"kv_cache_dtype"`
	NumLayers     int    `json:"num_layers"`
}

// Layout returns hello's layout fields.
func (h *Hello) Layout() Layout {
	return Layout{Model: h.Model, LayoutVersion: h.LayoutVersion, KVCacheDType: h.KVCacheDType, NumLayers: h.NumLayers}
}

// RegionSize is how many bytes of one named region a request carries.
type RegionSize struct {
	Name  string `json:"name"`
	Bytes int64  `json:"bytes"`
}

// Admit asks for a slot for one request's state.
type Admit struct {
	RID             string `json:"rid"`
	Magic           string `json:"magic"`
	ProtocolVersion int    `json:"protocol_version"`
	Model           string `json:"model"`
	LayoutVersion   int    `json:"layout_version"`
	KVCacheDType    string `json:"kv_cache_dtype"`
	NumLayers       int    `json:"num_layers"`
	SeqLen          int    `json:"seq_len"`
	// MTPLen is how many MTP-layer positions the state holds; omitted means
	// SeqLen (senders from before the field always shipped that). SeqLen-1
	// is a prefill that did not run the MTP layer on its sampled token.
	MTPLen          *int         `json:"mtp_len,omitempty"`
	LastPromptToken int          `json:"last_prompt_token"`
	PromptTokenIDs  []int        `json:"prompt_token_ids,omitempty"`
	Regions         []RegionSize `json:"regions"`
}

// MTPLength is MTPLen, or SeqLen when the field was omitted.
func (a *Admit) MTPLength() int {
	if a.MTPLen == nil {
		return a.SeqLen
	}
	return *a.MTPLen
}

// Layout returns admit's layout fields.
func (a *Admit) Layout() Layout {
	return Layout{Model: a.Model, LayoutVersion: a.LayoutVersion, KVCacheDType: a.KVCacheDType, NumLayers: a.NumLayers}
}

// TotalBytes sums the admitted region sizes.
func (a *Admit) TotalBytes() int64 {
	var n int64
	for _, r := range a.Regions {
		n += r.Bytes
	}
	return n
}

// Destination is where one admitted region's bytes go: Bytes bytes at
// Offset inside the remote region Remote (opened for this rid+generation).
type Destination struct {
	Name   string      `json:"name"`
	Offset int64       `json:"offset"`
	Bytes  int64       `json:"bytes"`
	Remote rdma.Remote `json:"remote"`
}

// Accept grants a slot; writes may start only after it arrives.
type Accept struct {
	RID        string        `json:"rid"`
	Slot       int           `json:"slot"`
	Generation uint64        `json:"generation"`
	DeadlineMS int64         `json:"deadline_ms"` // done must arrive within this, or the slot expires
	Regions    []Destination `json:"regions"`     // in admit order
}

// Reject refuses an admit.
type Reject struct {
	RID          string `json:"rid"`
	Error        string `json:"error"`
	RetryAfterMS int64  `json:"retry_after_ms,omitempty"`
	Message      string `json:"message,omitempty"`
}

// Done says every write for the accepted slot has completed.
type Done struct {
	RID        string `json:"rid"`
	Slot       int    `json:"slot"`
	Generation uint64 `json:"generation"`
	Bytes      int64  `json:"bytes"`
	// Checksum is CRC-32C (Castagnoli) over the written bytes, region by
	// region in accept order, each region's Bytes bytes from its Offset.
	Checksum uint32 `json:"checksum"`
}

// Ack answers done. OK means the state is in place and will be decoded.
type Ack struct {
	RID        string `json:"rid"`
	Slot       int    `json:"slot"`
	Generation uint64 `json:"generation"`
	OK         bool   `json:"ok"`
	Error      string `json:"error,omitempty"`
	Message    string `json:"message,omitempty"`
}

// ErrorMsg is sent before the server closes a connection it cannot continue
// (garbage frame, unexpected message).
type ErrorMsg struct {
	Error   string `json:"error"`
	Message string `json:"message,omitempty"`
}

func (*Hello) Type() string    { return TypeHello }
func (*Admit) Type() string    { return TypeAdmit }
func (*Accept) Type() string   { return TypeAccept }
func (*Reject) Type() string   { return TypeReject }
func (*Done) Type() string     { return TypeDone }
func (*Ack) Type() string      { return TypeAck }
func (*ErrorMsg) Type() string { return TypeError }
func (*AuthMsg) Type() string  { return TypeAuth }

func bad(format string, args ...any) error {
	return errors.Mark(errors.Newf("pd: "+format, args...), ErrBadMessage)
}

func (h *Hello) validate() error {
	if h.Challenge() {
		if len(h.Nonce) != 32 {
			return bad("hello: challenge nonce of %d bytes, want 32", len(h.Nonce))
		}
		return nil
	}
	if h.Transport.Kind == "" {
		return bad("hello without transport kind")
	}
	if h.Slots < 0 || h.Busy < 0 || h.Busy > h.Slots {
		return bad("hello: busy %d of %d slots", h.Busy, h.Slots)
	}
	return nil
}

func (a *AuthMsg) validate() error {
	if len(a.Nonce) != 32 || len(a.MAC) != 32 {
		return bad("auth: nonce of %d and mac of %d bytes, want 32 and 32", len(a.Nonce), len(a.MAC))
	}
	return nil
}

// MaxRIDBytes is the longest rid any message may carry; nodes configure a
// lower limit (security.max_rid_bytes, default 128).
const MaxRIDBytes = 4096

// CheckRID says what is wrong with rid: 1 to limit bytes of printable
// ASCII without spaces (a rid is a capability, logged and echoed, so it
// must be short and inert). limitName is named in the error.
func CheckRID(rid string, limit int, limitName string) error {
	if rid == "" {
		return errors.New("rid is empty")
	}
	if len(rid) > limit {
		return errors.Newf("rid of %d bytes exceeds %s (%d)", len(rid), limitName, limit)
	}
	for i := 0; i < len(rid); i++ {
		if c := rid[i]; c < 0x20 || c > 0x7e || c == '"' || c == '\\' {
			return errors.Newf("rid byte %d is %q: use printable ASCII without quotes or backslashes", i, c)
		}
	}
	return nil
}

func (a *Admit) validate() error {
	if a.RID == "" {
		return bad("admit without rid")
	}
	if len(a.RID) > MaxRIDBytes {
		return bad("admit: rid of %d bytes, at most %d", len(a.RID), MaxRIDBytes)
	}
	if a.SeqLen <= 0 {
		return bad("admit %s: seq_len %d must be positive", a.RID, a.SeqLen)
	}
	if m := a.MTPLength(); m < 0 || m > a.SeqLen {
		return bad("admit %s: mtp_len %d outside [0, seq_len %d]", a.RID, m, a.SeqLen)
	}
	if len(a.Regions) == 0 {
		return bad("admit %s: no regions", a.RID)
	}
	seen := map[string]bool{}
	for _, r := range a.Regions {
		if r.Name == "" || r.Bytes < 0 || seen[r.Name] {
			return bad("admit %s: region %q with %d bytes (empty name, negative size or listed twice)", a.RID, r.Name, r.Bytes)
		}
		seen[r.Name] = true
	}
	return nil
}

func (a *Accept) validate() error {
	if a.RID == "" || a.Generation == 0 || a.Slot < 0 {
		return bad("accept: rid %q slot %d generation %d", a.RID, a.Slot, a.Generation)
	}
	for _, d := range a.Regions {
		if d.Offset < 0 || d.Bytes < 0 || d.Offset > d.Remote.Len-d.Bytes {
			return bad("accept %s: destination %q [%d,+%d) outside its %d-byte region", a.RID, d.Name, d.Offset, d.Bytes, d.Remote.Len)
		}
	}
	return nil
}

func (r *Reject) validate() error {
	switch r.Error {
	case ReasonBusy, ReasonTooLong, ReasonLayoutMismatch, ReasonCancelling, ReasonBadRequest:
	default:
		return bad("reject %s: unknown error %q", r.RID, r.Error)
	}
	if r.RetryAfterMS < 0 {
		return bad("reject %s: negative retry_after_ms", r.RID)
	}
	return nil
}

func (d *Done) validate() error {
	if d.RID == "" || d.Generation == 0 || d.Bytes < 0 || d.Slot < 0 {
		return bad("done: rid %q slot %d generation %d bytes %d", d.RID, d.Slot, d.Generation, d.Bytes)
	}
	return nil
}

func (a *Ack) validate() error {
	if a.RID == "" {
		return bad("ack without rid")
	}
	if !a.OK && a.Error == "" {
		return bad("ack %s: not ok and no error", a.RID)
	}
	return nil
}

func (e *ErrorMsg) validate() error {
	if e.Error == "" {
		return bad("error message without error")
	}
	return nil
}

// Encode renders m as a frame payload: a JSON object whose "type" field
// names the message, followed by the message's own fields.
func Encode(m Message) ([]byte, error) {
	body, err := json.Marshal(m)
	if err != nil {
		return nil, errors.Wrapf(err, "pd: encode %s", m.Type())
	}
	// body is a JSON object; splice the type in front of its fields.
	var buf bytes.Buffer
	buf.Grow(len(body) + 16 + len(m.Type()))
	buf.WriteString(`{"type":`)
	t, _ := json.Marshal(m.Type())
	buf.Write(t)
	if len(body) > 2 {
		buf.WriteByte(',')
		buf.Write(body[1:])
	} else {
		buf.WriteByte('}')
	}
	return buf.Bytes(), nil
}

// Decode parses a frame payload into its message and checks its fields.
// Unknown fields are ignored so peers can add fields within a version.
func Decode(b []byte) (Message, error) {
	if !utf8.Valid(b) {
		return nil, errors.Mark(errors.New("pd: frame is not valid UTF-8"), ErrInvalidJSON)
	}
	var env struct {
		Type *string `json:"type"`
	}
	if err := json.Unmarshal(b, &env); err != nil {
		return nil, errors.Mark(errors.Wrap(err, "pd: frame"), ErrInvalidJSON)
	}
	if env.Type == nil {
		return nil, errors.Mark(errors.New("pd: frame without a \"type\" field"), ErrBadMessage)
	}
	var m Message
	switch *env.Type {
	case TypeHello:
		m = &Hello{}
	case TypeAdmit:
		m = &Admit{}
	case TypeAccept:
		m = &Accept{}
	case TypeReject:
		m = &Reject{}
	case TypeDone:
		m = &Done{}
	case TypeAck:
		m = &Ack{}
	case TypeError:
		m = &ErrorMsg{}
	case TypeAuth:
		m = &AuthMsg{}
	default:
		return nil, errors.Mark(errors.Newf("pd: unknown message type %q", *env.Type), ErrUnknownType)
	}
	if err := json.Unmarshal(b, m); err != nil {
		return nil, errors.Mark(errors.Wrapf(err, "pd: %s message", *env.Type), ErrBadMessage)
	}
	if err := m.validate(); err != nil {
		return nil, err
	}
	return m, nil
}
