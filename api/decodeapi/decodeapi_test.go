package decodeapi

import (
	"encoding/json"
	"testing"
	"time"
)

func TestCodeStatus(t *testing.T) {
	for _, tc := range []struct {
		code Code
		want int
	}{
		{CodeBadRequest, 400}, {CodeNotFound, 404}, {CodeMethodNotAllowed, 405}, {CodeDuplicateRID, 409},
		{CodeBusy, 429}, {CodeShuttingDown, 503}, {CodeKVTransferTimeout, 504}, {CodeImportFailed, 500},
		{CodeInternal, 500}, {Code("no_such_code"), 500},
	} {
		if got := tc.code.Status(); got != tc.want {
			t.Errorf("%s.Status() = %d, want %d", tc.code, got, tc.want)
		}
	}
	for code, st := range statusOf {
		if st == 500 {
			continue
		}
		if back, ok := CodeOf(st); !ok || back != code {
			t.Errorf("CodeOf(%d) = %q, %v; want %q (two codes share a status?)", st, back, ok, code)
		}
	}
}

// The wire format is what the router and older nodes speak: keep it.
func TestWireFormat(t *testing.T) {
	first, stream := 7, false
	for _, tc := range []struct {
		v    any
		want string
	}{
		{DecodeRequest{RID: "r", FirstTokenID: &first, MaxTokens: 3, Sampling: &Sampling{Temperature: 0.5, TopK: 2}, Stream: &stream},
			`{"rid":"r","first_token_id":7,"max_tokens":3,"sampling":{"temperature":0.5,"top_k":2},"stream":false}`},
		{TokensLine{T: []int{1, 2}}, `{"t":[1,2]}`},
		{FinalLine{Done: true, N: 2, FinishReason: FinishStop, TimingMS: map[string]float64{"total": 1.5}},
			`{"done":true,"n":2,"finish_reason":"stop","timing_ms":{"total":1.5},"mtp_accept_mean":0}`},
		{DecodeResponse{RID: "r", T: []int{3}, FinalLine: FinalLine{Done: true, FinishReason: FinishLength}},
			`{"rid":"r","t":[3],"done":true,"n":0,"finish_reason":"length","timing_ms":null,"mtp_accept_mean":0}`},
		{(&Error{Code: CodeBusy, Message: "full", RetryAfter: 1500 * time.Millisecond}).Body(),
			`{"error":"busy","message":"full","retry_after_ms":1500}`},
		{Health{Status: "draining"}, `{"status":"draining"}`},
		{CancelResponse{RID: "r", Cancelled: true, State: CancelWaiting}, `{"rid":"r","cancelled":true,"state":"waiting"}`},
	} {
		b, err := json.Marshal(tc.v)
		if err != nil {
			t.Fatal(err)
		}
		if string(b) != tc.want {
			t.Errorf("%T:\n got %s\nwant %s", tc.v, b, tc.want)
		}
	}
}

func TestParseLineAndError(t *testing.T) {
	for _, tc := range []struct {
		line  string
		final bool
		n     int
	}{
		{`{"t":[1,2,3]}`, false, 3},
		{`{"done":true,"n":3,"finish_reason":"stop"}`, true, 0},
		{`{"n":1,"finish_reason":"error","error":"engine_error","message":"boom"}`, true, 0},
	} {
		l, err := ParseLine([]byte(tc.line))
		if err != nil || l.Final() != tc.final || len(l.T) != tc.n {
			t.Errorf("ParseLine(%s) = %+v, %v", tc.line, l, err)
		}
	}
	e := ParseError(429, []byte(`{"error":"busy","message":"all 1 slots busy","retry_after_ms":2000}`))
	if e.Code != CodeBusy || e.RetryAfter != 2*time.Second || e.RetryAfterHeader() != "2" {
		t.Errorf("ParseError(busy body) = %+v", e)
	}
	e = ParseError(504, []byte("gateway timeout"))
	if e.Code != CodeKVTransferTimeout || e.Message != "gateway timeout" {
		t.Errorf("ParseError(504 text) = %+v", e)
	}
}
