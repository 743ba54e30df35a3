package engine

import (
	"testing"

	"github.com/cockroachdb/errors"
)

func TestCheckImport(t *testing.T) {
	ok := SlotMeta{SeqLen: 10, MTPLen: 10, LastToken: 5}
	tests := []struct {
		name string
		meta SlotMeta
		segs []Segment
		mtp  bool
		want error
	}{
		{"valid", ok, []Segment{{Offset: 0, Data: make([]byte, 100)}}, true, nil},
		{"empty", SlotMeta{SeqLen: 0}, nil, false, ErrTooLong},
		{"too long", SlotMeta{SeqLen: 64, MTPLen: 64}, nil, false, ErrTooLong},
		{"mtp past seq", SlotMeta{SeqLen: 10, MTPLen: 11}, nil, false, ErrBadLayout},
		{"mtp missing", SlotMeta{SeqLen: 10, MTPLen: 8}, nil, true, ErrBadLayout},
		{"mtp one short is fine", SlotMeta{SeqLen: 10, MTPLen: 9, LastToken: 1}, nil, true, nil},
		{"bad token", SlotMeta{SeqLen: 10, MTPLen: 10, LastToken: 32}, nil, false, ErrBadTokenID},
		{"segment past end", ok, []Segment{{Offset: 90, Data: make([]byte, 20)}}, false, ErrBadLayout},
		{"negative offset", ok, []Segment{{Offset: -1, Data: make([]byte, 1)}}, false, ErrBadLayout},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := CheckImport(tc.meta, tc.segs, 64, 32, tc.mtp, 100)
			if tc.want == nil && err != nil || tc.want != nil && !errors.Is(err, tc.want) {
				t.Errorf("got %v, want %v", err, tc.want)
			}
		})
	}
}

func TestParamsFinish(t *testing.T) {
	p := Params{StopIDs: []int{7}, MaxTokens: 5}
	tests := []struct {
		tok, generated, seqLen int
		want                   FinishReason
	}{
		{7, 1, 10, FinishStop},
		{3, 5, 10, FinishLength},
		{3, 4, 63, FinishLength}, // no room under maxSeq 64
		{3, 4, 62, FinishNone},
	}
	for _, tc := range tests {
		if got := p.Finish(tc.tok, tc.generated, tc.seqLen, 64); got != tc.want {
			t.Errorf("Finish(%d, %d, %d) = %q, want %q", tc.tok, tc.generated, tc.seqLen, got, tc.want)
		}
	}
	if got := (Params{}).Finish(3, 1000, 10, 64); got != FinishNone {
		t.Errorf("no MaxTokens: %q", got)
	}
}
