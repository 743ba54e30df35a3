package pd

import (
	"bytes"
	"encoding/binary"
	"io"
	"reflect"
	"strings"
	"testing"

	"github.com/cockroachdb/errors"

	"github.com/tilert-go/tilert/rdma"
)

func frame(payload string) []byte {
	b := make([]byte, 4+len(payload))
	binary.BigEndian.PutUint32(b, uint32(len(payload)))
	copy(b[4:], payload)
	return b
}

func sampleMessages() []Message {
	return []Message{
		&Hello{Magic: Magic, ProtocolVersion: 1, Model: "glm5", LayoutVersion: 1, KVCacheDType: "fp8_ds_mla",
			NumLayers: 79, MaxSeqLen: 202752, Transport: Transport{Kind: "tcp", Endpoint: "tcp://10.0.0.2:5560"},
			Slots: 4, Busy: 1, Regions: []RegionCap{{"mla", 1 << 30}, {"indexer", 1 << 28}}},
		&Admit{RID: "r-1", Magic: Magic, ProtocolVersion: 1, Model: "glm5", LayoutVersion: 1, KVCacheDType: "fp8_ds_mla",
			NumLayers: 79, SeqLen: 1000, LastPromptToken: 42, PromptTokenIDs: []int{1, 2, 42},
			Regions: []RegionSize{{"mla", 656 * 1000 * 79}, {"indexer", 8448 * 16 * 79}}},
		&Admit{RID: "r-mtp", Magic: Magic, ProtocolVersion: 1, Model: "glm5", LayoutVersion: 1, KVCacheDType: "fp8_ds_mla",
			NumLayers: 79, SeqLen: 1000, MTPLen: intPtr(999), LastPromptToken: 42,
			Regions: []RegionSize{{"mla", 656 * 1000 * 79}, {"indexer", 8448 * 16 * 79}}},
		&Accept{RID: "r-1", Slot: 2, Generation: 7, DeadlineMS: 30000, Regions: []Destination{
			{Name: "mla", Offset: 0, Bytes: 100, Remote: rdma.Remote{ID: 5, Key: 7, Len: 1000, Kind: rdma.HostMem}},
			{Name: "indexer", Offset: 64, Bytes: 10, Remote: rdma.Remote{ID: 6, Key: 7, Len: 1000, Addr: 0xdead0000, Meta: []byte{0, 1, 2, 255}}},
		}},
		&Reject{RID: "r-2", Error: ReasonBusy, RetryAfterMS: 250, Message: "all 4 slots busy"},
		&Done{RID: "r-1", Slot: 2, Generation: 7, Bytes: 110, Checksum: 0xdeadbeef},
		&Ack{RID: "r-1", Slot: 2, Generation: 7, OK: true},
		&Ack{RID: "r-1", Slot: 2, Generation: 7, Error: AckStale, Message: "expired"},
		&ErrorMsg{Error: "bad_frame", Message: "frame is not JSON"},
	}
}

func TestMessageRoundTrip(t *testing.T) {
	for _, m := range sampleMessages() {
		t.Run(m.Type(), func(t *testing.T) {
			var buf bytes.Buffer
			if err := WriteMessage(&buf, m); err != nil {
				t.Fatal(err)
			}
			if !bytes.Contains(buf.Bytes(), []byte(`{"type":"`+m.Type()+`",`)) {
				t.Fatalf("payload does not start with its type: %s", buf.Bytes()[4:])
			}
			got, err := ReadMessage(&buf)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, m) {
				t.Fatalf("round trip:\n got %#v\nwant %#v", got, m)
			}
			if _, err := ReadMessage(&buf); err != io.EOF {
				t.Fatalf("after the last frame: want io.EOF, got %v", err)
			}
		})
	}
}

func intPtr(v int) *int { return &v }

// mtp_len is optional: omitted it reads as seq_len (senders from before the
// field), present it is kept as sent, 0 included.
func TestAdmitMTPLenField(t *testing.T) {
	cases := []struct {
		name    string
		payload string
		want    int
		present bool
	}{
		{"omitted", `{"type":"admit","rid":"a","seq_len":9,"regions":[{"name":"m","bytes":1}]}`, 9, false},
		{"equal", `{"type":"admit","rid":"a","seq_len":9,"mtp_len":9,"regions":[{"name":"m","bytes":1}]}`, 9, true},
		{"one short", `{"type":"admit","rid":"a","seq_len":9,"mtp_len":8,"regions":[{"name":"m","bytes":1}]}`, 8, true},
		{"zero", `{"type":"admit","rid":"a","seq_len":9,"mtp_len":0,"regions":[{"name":"m","bytes":1}]}`, 0, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			m, err := Decode([]byte(tc.payload))
			if err != nil {
				t.Fatal(err)
			}
			a := m.(*Admit)
			if a.MTPLength() != tc.want || (a.MTPLen != nil) != tc.present {
				t.Fatalf("mtp_len %v (length %d), want %d present=%v", a.MTPLen, a.MTPLength(), tc.want, tc.present)
			}
			b, err := Encode(a)
			if err != nil {
				t.Fatal(err)
			}
			if got := bytes.Contains(b, []byte(`"mtp_len":`)); got != tc.present {
				t.Fatalf("re-encoded %s: mtp_len present %v, want %v", b, got, tc.present)
			}
			back, err := Decode(b)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(back, a) {
				t.Fatalf("round trip:\n got %#v\nwant %#v", back, a)
			}
		})
	}
}

func TestReadFrameErrors(t *testing.T) {
	huge := make([]byte, 4)
	binary.BigEndian.PutUint32(huge, MaxFrame+1)
	cases := []struct {
		name string
		in   []byte
		want error
	}{
		{"oversize", huge, ErrOversize},
		{"oversize max uint32", []byte{0xff, 0xff, 0xff, 0xff}, ErrOversize},
		{"truncated length", []byte{0, 0}, ErrTruncated},
		{"truncated body", frame(`{"type":"ack"}`)[:10], ErrTruncated},
		{"empty", []byte{0, 0, 0, 0}, ErrEmpty},
		{"not json", frame(`hello there`), ErrInvalidJSON},
		{"json array", frame(`[1,2]`), ErrInvalidJSON},
		{"invalid utf8", frame("{\"type\":\"ack\",\"rid\":\"\xff\"}"), ErrInvalidJSON},
		{"trailing garbage", frame(`{"type":"ack","rid":"a","ok":true} x`), ErrInvalidJSON},
		{"no type", frame(`{"rid":"a"}`), ErrBadMessage},
		{"null", frame(`null`), ErrBadMessage},
		{"unknown type", frame(`{"type":"gossip"}`), ErrUnknownType},
		{"wrong field type", frame(`{"type":"admit","rid":"a","seq_len":"ten"}`), ErrBadMessage},
		{"admit without rid", frame(`{"type":"admit","seq_len":3,"regions":[{"name":"mla","bytes":1}]}`), ErrBadMessage},
		{"admit without regions", frame(`{"type":"admit","rid":"a","seq_len":3}`), ErrBadMessage},
		{"admit negative mtp_len", frame(`{"type":"admit","rid":"a","seq_len":3,"mtp_len":-1,"regions":[{"name":"m","bytes":1}]}`), ErrBadMessage},
		{"admit mtp_len past seq_len", frame(`{"type":"admit","rid":"a","seq_len":3,"mtp_len":4,"regions":[{"name":"m","bytes":1}]}`), ErrBadMessage},
		{"admit duplicate region", frame(`{"type":"admit","rid":"a","seq_len":3,"regions":[{"name":"m","bytes":1},{"name":"m","bytes":1}]}`), ErrBadMessage},
		{"reject unknown reason", frame(`{"type":"reject","rid":"a","error":"sleepy"}`), ErrBadMessage},
		{"done generation 0", frame(`{"type":"done","rid":"a","slot":0,"generation":0}`), ErrBadMessage},
		{"accept out of range", frame(`{"type":"accept","rid":"a","slot":0,"generation":1,"regions":[{"name":"m","offset":8,"bytes":8,"remote":{"id":1,"key":1,"len":10}}]}`), ErrBadMessage},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ReadMessage(bytes.NewReader(tc.in))
			if !errors.Is(err, tc.want) {
				t.Fatalf("want %v, got %v", tc.want, err)
			}
		})
	}
}

func TestWriteFrameErrors(t *testing.T) {
	var buf bytes.Buffer
	if err := WriteFrame(&buf, make([]byte, MaxFrame+1)); !errors.Is(err, ErrOversize) {
		t.Fatalf("oversize: %v", err)
	}
	if err := WriteFrame(&buf, nil); !errors.Is(err, ErrEmpty) {
		t.Fatalf("empty: %v", err)
	}
	if buf.Len() != 0 {
		t.Fatal("a refused frame wrote bytes")
	}
	// The largest frame passes.
	big := `{"type":"error","error":"x","message":"` + strings.Repeat("a", MaxFrame-41) + `"}`
	if err := WriteFrame(&buf, []byte(big)); err != nil {
		t.Fatal(err)
	}
	m, err := ReadMessage(&buf)
	if err != nil {
		t.Fatal(err)
	}
	if len(m.(*ErrorMsg).Message) != MaxFrame-41 {
		t.Fatal("large frame content changed")
	}
}

func FuzzReadFrame(f *testing.F) {
	for _, m := range sampleMessages() {
		b, err := Encode(m)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(frame(string(b)))
	}
	f.Add([]byte{0xff, 0xff, 0xff, 0xff})
	f.Add(frame(`{"type":"admit","rid":"a","seq_len":1,"regions":[{"name":"x","bytes":-1}]}`))
	f.Fuzz(func(t *testing.T, in []byte) {
		r := bytes.NewReader(in)
		for {
			m, err := ReadMessage(r)
			if err != nil {
				known := err == io.EOF
				for _, e := range []error{ErrOversize, ErrTruncated, ErrEmpty, ErrInvalidJSON, ErrUnknownType, ErrBadMessage} {
					known = known || errors.Is(err, e)
				}
				if !known {
					t.Fatalf("error not marked with a frame error: %v", err)
				}
				return
			}
			// Whatever decodes must encode and decode to the same message.
			b, err := Encode(m)
			if err != nil {
				t.Fatalf("re-encode %T: %v", m, err)
			}
			m2, err := Decode(b)
			if err != nil {
				t.Fatalf("decode of re-encoded %T: %v\n%s", m, err, b)
			}
			if !reflect.DeepEqual(m, m2) {
				t.Fatalf("re-encode changed the message:\n%#v\n%#v", m, m2)
			}
		}
	})
}
