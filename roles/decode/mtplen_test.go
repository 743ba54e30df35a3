package decode

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/tilert-go/tilert/engine"
	"github.com/tilert-go/tilert/pd"
)

// The admit's mtp_len reaches the engine: a state shipped with the MTP
// layer covering the prompt (as vLLM's drafter leaves it) or one position
// short (the engine recomputes that one from the last prompt token) decodes
// to exactly what the sending engine generates itself; less is refused.
func TestHandoffMTPLen(t *testing.T) {
	cases := []struct {
		name   string
		short  int // mtp_len = seq_len - short
		reason string
	}{
		{"mtp_len=seq_len", 0, ""},
		{"mtp_len=seq_len-1", 1, ""},
		{"mtp_len=seq_len-2", 2, pd.ReasonBadRequest},
	}
	for _, dev := range []string{"cpu", "cuda"} {
		for _, c := range cases {
			t.Run(dev+"/"+c.name, func(t *testing.T) {
				handoffMTPLen(t, rigOpts{mtp: true, device: dev}, c.short, c.reason)
			})
		}
	}
}

// handoffMTPLen ships exported slots with mtp_len = seq_len - short; a
// non-empty reason is the reject expected.
func handoffMTPLen(t *testing.T, o rigOpts, short int, reason string) {
	r := newRig(t, o)
	for i, n := range []int{5, 64, 70} {
		before := senderStats(t, o)
		pr := prepare(t, o, fmt.Sprintf("m%d", i), randomPrompt(uint64(40+i), n, r.lm.cfg.VocabSize), engine.Params{MaxTokens: 14})
		after := senderStats(t, o)
		nodeDrafted, nodeAccepted := r.node.m.mtpDrafted.With().Value(), r.node.m.mtpAccepted.With().Value()
		if pr.meta.MTPLen != pr.meta.SeqLen {
			t.Fatalf("export mtp_len %d, seq_len %d", pr.meta.MTPLen, pr.meta.SeqLen)
		}
		pr.meta.MTPLen -= short
		s := newSender(t, r, "tcp")
		out := s.pack(pr)
		if got := out.Admit.MTPLength(); got != pr.meta.MTPLen {
			t.Fatalf("Pack: admit mtp_len %d, meta %d", got, pr.meta.MTPLen)
		}
		_, err := s.c.Send(t.Context(), out.Admit, out.Sources)
		if reason != "" {
			var rej *pd.RejectError
			if !errors.As(err, &rej) || rej.Reject.Error != reason || !strings.Contains(rej.Reject.Message, "mtp_len") {
				t.Fatalf("want %s naming mtp_len, got %v", reason, err)
			}
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		checkEqual(t, pr, r.decode(t, decodeBody(pr)))
		if short == 1 {
			// The recomputed MTP entry is the sender's own: the node
			// drafts and accepts exactly what the sender did.
			d := r.node.m.mtpDrafted.With().Value() - nodeDrafted
			a := r.node.m.mtpAccepted.With().Value() - nodeAccepted
			if int64(d) != after.DraftTokens-before.DraftTokens || int64(a) != after.AcceptedTokens-before.AcceptedTokens {
				t.Fatalf("%s: node drafted %v accepted %v, the sender %d and %d", pr.rid, d, a,
					after.DraftTokens-before.DraftTokens, after.AcceptedTokens-before.AcceptedTokens)
			}
		}
	}
	waitFor(t, "every slot free", func() bool { return r.allFree(t) })
	if reason == "" && r.node.m.mtpDrafted.With().Value() == 0 {
		t.Fatal("MTP on but no draft tokens were verified")
	}
}

// senderStats is the counters of prepare's engine for o (zero before its first use).
func senderStats(t testing.TB, o rigOpts) engine.Stats {
	t.Helper()
	if o.preset == "" {
		o.preset = "glm-5-tiny"
	}
	if o.kv == "" {
		o.kv = engine.CacheFP8DSMLA
	}
	senderMu.Lock()
	defer senderMu.Unlock()
	v, ok := senderEngines.Load(fmt.Sprintf("%s/%v/%s/%s", o.preset, o.mtp, o.kv, o.device))
	if !ok {
		return engine.Stats{}
	}
	return v.(engine.Engine).Stats()
}
