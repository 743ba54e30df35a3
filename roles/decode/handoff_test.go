package decode

import (
	"fmt"
	"sync"
	"testing"

	"github.com/tilert-go/tilert/api/decodeapi"
	"github.com/tilert-go/tilert/engine"
)

// The sender plays prefill: a separate CPU engine prefills, exports the
// state in vLLM's layout, and the state goes through the ctrl protocol and a
// transfer engine into the node, which streams exactly what the sending
// engine generates itself from the same state.
func TestHandoffEqualsLocalGeneration(t *testing.T) {
	type tc struct {
		device    string
		transport string
		mtp       bool
		n         int
	}
	var cases []tc
	for _, dev := range []string{"cpu", "cuda", "emu-tp4", "cuda-tp4"} {
		for _, tr := range []string{"tcp", "nixl"} {
			if dev == "emu-tp4" && tr != "tcp" {
				continue // the emulator is slow; the transports are the same for it
			}
			for _, mtp := range []bool{false, true} {
				for _, n := range []int{1, 4} {
					cases = append(cases, tc{dev, tr, mtp, n})
				}
			}
		}
	}
	for _, c := range cases {
		t.Run(fmt.Sprintf("%s/%s/mtp=%v/N=%d", c.device, c.transport, c.mtp, c.n), func(t *testing.T) {
			o := rigOpts{slots: c.n, mtp: c.mtp, transport: c.transport, device: c.device}
			if c.n > 1 {
				o.minBatch = c.n // every request joins the first step: decoded together
			}
			r := newRig(t, o)
			vocab := r.lm.cfg.VocabSize
			// Prompt lengths around the 64-token page edge; the last two
			// sample (temperature, top-k, top-p, seed).
			lens := []int{5, 64, 70, 130}
			var prs []*prepared
			for i := 0; i < 4; i++ {
				p := engine.Params{MaxTokens: 12 + 3*i}
				if i >= 2 {
					p.Temperature, p.TopK, p.TopP, p.Seed = 0.9, 40, 0.95, uint64(100+i)
				}
				prs = append(prs, prepare(t, o, fmt.Sprintf("r%d", i), randomPrompt(uint64(i+1), lens[i], vocab), p))
			}
			if c.n == 1 {
				for i, pr := range prs {
					s := newSender(t, r, c.transport)
					if i%2 == 0 {
						// /pd/decode first: it waits for the state.
						res := make(chan *decodeResult, 1)
						go func() { res <- r.decode(t, decodeBody(pr)) }()
						waitFor(t, "the request to wait for its state", func() bool {
							var st decodeapi.Status
							r.getJSON(t, "/decode_status", &st)
							return len(st.Requests) == 1
						})
						if err := s.send(pr); err != nil {
							t.Fatal(err)
						}
						checkEqual(t, pr, <-res)
					} else {
						// State first: /pd/decode finds it ready.
						if err := s.send(pr); err != nil {
							t.Fatal(err)
						}
						checkEqual(t, pr, r.decode(t, decodeBody(pr)))
					}
				}
				if r.node.MaxBatch() != 1 {
					t.Fatalf("max batch %d with one slot", r.node.MaxBatch())
				}
			} else {
				var wg sync.WaitGroup
				results := make([]*decodeResult, len(prs))
				errs := make([]error, len(prs))
				for i, pr := range prs {
					s := newSender(t, r, c.transport)
					wg.Add(2)
					go func() { defer wg.Done(); errs[i] = s.send(pr) }()
					go func() {
						defer wg.Done()
						results[i] = r.decode(t, decodeBody(pr))
						if results[i].status != 200 {
							t.Errorf("%s: status %d: %s", pr.rid, results[i].status, results[i].body)
						}
					}()
				}
				wg.Wait()
				for i, pr := range prs {
					if errs[i] != nil {
						t.Fatalf("%s: send: %v", pr.rid, errs[i])
					}
					checkEqual(t, pr, results[i])
				}
				// A request whose first token already ends it never steps.
				stepping := 0
				for _, pr := range prs {
					if len(pr.want) > 0 {
						stepping++
					}
				}
				if r.node.MaxBatch() != stepping {
					t.Fatalf("max batch %d, want all %d stepping requests in one step", r.node.MaxBatch(), stepping)
				}
			}
			waitFor(t, "every slot free", func() bool { return r.allFree(t) })
			if c.mtp {
				if d := r.node.m.mtpDrafted.With().Value(); d == 0 {
					t.Fatalf("MTP on but no draft tokens were verified")
				}
			} else if d := r.node.m.mtpDrafted.With().Value(); d != 0 {
				t.Fatalf("MTP off but %v draft tokens", d)
			}
		})
	}
}

// Both families and both MLA cache dtypes through one node each.
func TestHandoffFamiliesAndCacheDTypes(t *testing.T) {
	for _, preset := range []string{"deepseek-v3.2-tiny", "glm-5-tiny"} {
		for _, kv := range []engine.CacheDType{engine.CacheFP8DSMLA, engine.CacheBF16} {
			t.Run(preset+"/"+string(kv), func(t *testing.T) {
				o := rigOpts{preset: preset, kv: kv, mtp: true}
				r := newRig(t, o)
				pr := prepare(t, o, "fam", randomPrompt(9, 80, r.lm.cfg.VocabSize), engine.Params{MaxTokens: 16})
				if err := newSender(t, r, "tcp").send(pr); err != nil {
					t.Fatal(err)
				}
				checkEqual(t, pr, r.decode(t, decodeBody(pr)))
			})
		}
	}
}
