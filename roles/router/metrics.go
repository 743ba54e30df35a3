package router

import (
	"github.com/tilert-go/tilert/metrics"
)

// Request outcomes, the label of tilert_router_requests_total.
const (
	outcomeOK           = "ok"
	outcomeCancelled    = "cancelled"     // the client went away
	outcomeBadRequest   = "bad_request"   // 400/404/405
	outcomeRejected     = "rejected"      // 429: queue full or queue timeout
	outcomePrefillError = "prefill_error" // vLLM unreachable or failed
	outcomeDecodeError  = "decode_error"  // the decode node failed or refused
	outcomeUnavailable  = "unavailable"   // 503: no decode node is up
	outcomeSpilled      = "spilled"       // proxied to --spill-url
)

type routerMetrics struct {
	reg        *metrics.Registry
	requests   *metrics.CounterVec
	rejects    *metrics.CounterVec
	cancels    *metrics.CounterVec
	tokens     *metrics.CounterVec
	ttft       *metrics.HistogramVec
	itl        *metrics.HistogramVec
	prefill    *metrics.HistogramVec
	queueWait  *metrics.HistogramVec
	requestDur *metrics.HistogramVec
	nodeDown   *metrics.CounterVec
	failovers  *metrics.CounterVec
	spilled    *metrics.CounterVec
	waves      *metrics.CounterVec
}

func newRouterMetrics(g *gate) *routerMetrics {
	r := metrics.NewRegistry()
	m := &routerMetrics{
		reg: r,
		requests: r.NewCounter("tilert_router_requests_total",
			"Requests by endpoint and outcome (ok, cancelled, bad_request, rejected, unavailable, spilled, prefill_error, decode_error).", "endpoint", "outcome"),
		rejects: r.NewCounter("tilert_router_queue_rejects_total",
			"Requests refused by the admission gate, by reason (queue_full, queue_timeout: 429; no_nodes: 503).", "reason"),
		cancels: r.NewCounter("tilert_router_decode_cancels_total",
			"POST /pd/cancel sent to decode nodes, by reason (client_gone, stop_string, first_token, error).", "reason"),
		tokens: r.NewCounter("tilert_router_tokens_total", "Tokens by kind (prompt, completion).", "kind"),
		ttft: r.NewHistogram("tilert_router_ttft_seconds",
			"Request arrival to the first token's text being sent (or known, non-streamed).", metrics.ExpBuckets(0.001, 2, 16)),
		itl: r.NewHistogram("tilert_router_inter_token_seconds",
			"Time between tokens arriving from the decode node (a line of k tokens counts k gaps of 1/k).", metrics.ExpBuckets(0.0001, 2, 16)),
		prefill: r.NewHistogram("tilert_router_prefill_seconds",
			"The vLLM prefill call (max_tokens=1), by result.", metrics.ExpBuckets(0.001, 2, 16), "result"),
		queueWait: r.NewHistogram("tilert_router_queue_wait_seconds",
			"Time spent in the admission gate before a decode slot was granted.", metrics.ExpBuckets(0.0001, 2, 18)),
		requestDur: r.NewHistogram("tilert_router_request_seconds",
			"Whole requests, by endpoint.", metrics.ExpBuckets(0.001, 2, 18), "endpoint"),
		nodeDown: r.NewCounter("tilert_router_node_down_total",
			"Decode nodes marked down (failed /health, unreachable, or failed a request)."),
		failovers: r.NewCounter("tilert_router_failovers_total",
			"Requests moved to another decode node before their first decoded token, by stage (prefill, decode).", "stage"),
		spilled: r.NewCounter("tilert_router_spilled_total",
			"Requests proxied to --spill-url, by reason (pool_full, pool_down, n and prompts: more generations than a request may run in waves, best_of, echo, suffix, response_format, tool_choice, or an unserved field's name).", "reason"),
		waves: r.NewCounter("tilert_router_wave_requests_total",
			"Requests of more generations (n x prompts) than the pool's decode slots, served in waves of at most the pool's slots at once (counted when the first choice starts), by endpoint.", "endpoint"),
	}
	for _, ep := range []string{"completions", "chat_completions"} {
		for _, o := range []string{outcomeOK, outcomeCancelled, outcomeBadRequest, outcomeRejected, outcomeUnavailable, outcomeSpilled, outcomePrefillError, outcomeDecodeError} {
			m.requests.Init(ep, o)
		}
	}
	m.rejects.Init("queue_full")
	m.rejects.Init("queue_timeout")
	m.rejects.Init("no_nodes")
	m.nodeDown.Init()
	for _, st := range []string{"prefill", "decode"} {
		m.failovers.Init(st)
	}
	for _, r := range []string{spillFull, spillDown, spillN, spillBatch, spillBestOf, spillEcho, spillSuffix, spillStructured, spillToolChoice} {
		m.spilled.Init(r)
	}
	for _, ep := range []string{"completions", "chat_completions"} {
		m.waves.Init(ep)
	}
	m.tokens.Init("prompt")
	m.tokens.Init("completion")
	r.NewGauge("tilert_router_queue_depth", "Requests waiting in the admission gate for a decode slot.", func() float64 { return float64(g.queued()) })
	r.NewGauge("tilert_router_slots_busy", "Decode slots in use over all nodes.", func() float64 { b, _ := g.busy(); return float64(b) })
	r.NewGauge("tilert_router_slots", "Decode slots over the nodes that are up (each node's max_inflight).", func() float64 { _, t := g.busy(); return float64(t) })
	r.NewGauge("tilert_router_nodes_up", "Decode nodes up (answering /health).", func() float64 { return float64(g.upCount()) })
	return m
}
