package decode

import (
	"context"
	"fmt"
	"testing"

	"github.com/tilert-go/tilert/engine"
)

// BenchmarkHandoff is one request's state through the node's ctrl port and
// the tcp transfer engine on loopback: admit, one-sided writes, done with
// the CRC check, WaitReady; MB/s is state bytes per second end to end.
func BenchmarkHandoff(b *testing.B) {
	for _, seq := range []int{64, 1000} {
		b.Run(fmt.Sprintf("tcp/glm-5-tiny/seq=%d", seq), func(b *testing.B) {
			o := rigOpts{maxSeq: 1024}
			r := newRig(b, o)
			pr := prepare(b, o, "bench", randomPrompt(1, seq, r.lm.cfg.VocabSize), engine.Params{MaxTokens: 1})
			s := newSender(b, r, "tcp")
			out := s.pack(pr)
			b.SetBytes(int64(len(out.Buf)))
			b.ReportAllocs()
			ctx := context.Background()
			i := 0
			for b.Loop() {
				out.Admit.RID = fmt.Sprintf("bench-%d", i)
				i++
				if _, err := s.c.Send(ctx, out.Admit, out.Sources); err != nil {
					b.Fatal(err)
				}
				rd, err := r.node.table.WaitReady(ctx, out.Admit.RID)
				if err != nil {
					b.Fatal(err)
				}
				if err := r.node.table.Release(rd.Slot, rd.Generation); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkDecodeStream is a whole /pd/decode of 16 tokens over HTTP on the
// tiny model (state already in place): the node's overhead around the
// engine's steps.
func BenchmarkDecodeStream(b *testing.B) {
	o := rigOpts{}
	r := newRig(b, o)
	pr := prepare(b, o, "bench", randomPrompt(2, 32, r.lm.cfg.VocabSize), engine.Params{MaxTokens: 16})
	s := newSender(b, r, "tcp")
	out := s.pack(pr)
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		rid := fmt.Sprintf("bench-%d", i)
		i++
		out.Admit.RID = rid
		if _, err := s.c.Send(context.Background(), out.Admit, out.Sources); err != nil {
			b.Fatal(err)
		}
		body := decodeBody(pr)
		body["rid"], body["ignore_eos"] = rid, true
		if d := r.decode(b, body); d.status != 200 || len(d.ids) != 15 {
			b.Fatalf("decode: %d %v", d.status, d.ids)
		}
	}
}
