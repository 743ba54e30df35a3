package prefillshim

import (
	"github.com/valyala/fasthttp"

	"github.com/tilert-go/tilert/internal/fastserve"
	"github.com/tilert-go/tilert/metrics"
)

type sidecarMetrics struct {
	reg      *metrics.Registry
	requests *metrics.CounterVec
	frames   *metrics.CounterVec
	retries  *metrics.CounterVec
	bytes    *metrics.Counter
	dials    *metrics.Counter
	seconds  *metrics.HistogramVec
	zeroCopy *metrics.CounterVec
}

func newMetrics(s *Sidecar) *sidecarMetrics {
	r := metrics.NewRegistry()
	m := &sidecarMetrics{reg: r,
		requests: r.NewCounter("tilert_sidecar_requests_total",
			"Staged requests by outcome (ok, busy_timeout, rejected_<reason>, ack_<error>, connect_failed, transfer_failed, staging_error, bad_request, staging_full, queue_full, shutting_down, aborted).", "outcome"),
		frames: r.NewCounter("tilert_sidecar_socket_errors_total",
			"Frames from the plugin refused, by error code (bad_frame closes the connection).", "error"),
		retries: r.NewCounter("tilert_sidecar_retries_total",
			"Send attempts repeated, by reason (busy: the node had no free slot; stale_connection: a pooled ctrl connection had closed).", "reason"),
		bytes: r.NewCounter("tilert_sidecar_transfer_bytes_total", "State bytes shipped and acknowledged by decode nodes.").With(),
		dials: r.NewCounter("tilert_sidecar_ctrl_dials_total", "Ctrl connections opened to decode nodes.").With(),
		zeroCopy: r.NewCounter("tilert_sidecar_zero_copy_requests_total",
			"Requests sent straight from vLLM's GPU cache (stage_blocks), by outcome; also counted in requests_total.", "outcome"),
		seconds: r.NewHistogram("tilert_sidecar_ship_seconds",
			"Time from a stage's arrival on the socket to the node's ack.", metrics.ExpBuckets(0.0001, 2, 18)),
	}
	for _, o := range []string{OutcomeOK, OutcomeBusyTimeout, OutcomeConnectFailed, OutcomeTransferFailed, OutcomeBadRequest, OutcomeStagingFull} {
		m.requests.Init(o)
	}
	for _, c := range []string{ErrCodeBadFrame, ErrCodeBadRequest, ErrCodeStagingFull} {
		m.frames.Init(c)
	}
	r.NewGauge("tilert_sidecar_queue_depth", "Staged requests waiting for a sender.", func() float64 { return float64(len(s.queue)) })
	r.NewGauge("tilert_sidecar_inflight", "Requests being sent now.", func() float64 { return float64(s.inflight.Load()) })
	r.NewGauge("tilert_sidecar_staged_bytes", "Bytes of staging files queued or in flight.", func() float64 { return float64(s.staged.Load()) })
	r.NewGauge("tilert_sidecar_staging_limit_bytes", "The staging limit (sidecar.staging_mib).", func() float64 { return float64(s.o.StagingBytes) })
	return m
}

// Handler serves GET /metrics (Prometheus text) and GET /health.
func (s *Sidecar) Handler() fasthttp.RequestHandler {
	return fastserve.Routes(map[string]fastserve.Route{
		"/metrics": {Method: fasthttp.MethodGet, Handler: func(ctx *fasthttp.RequestCtx) {
			ctx.SetContentType(metrics.ContentType)
			_ = s.m.reg.Write(ctx)
		}},
		"/health": {Method: fasthttp.MethodGet, Handler: func(ctx *fasthttp.RequestCtx) {
			s.mu.Lock()
			closing := s.closing
			s.mu.Unlock()
			status, code := "ok", fasthttp.StatusOK
			if closing {
				status, code = "draining", fasthttp.StatusServiceUnavailable
			}
			fastserve.WriteJSON(ctx, code, map[string]any{"status": status, "queued": len(s.queue), "inflight": s.inflight.Load(),
				"staged_bytes": s.staged.Load(), "staging_limit_bytes": s.o.StagingBytes, "transport": s.o.Transfer.Kind()})
		}},
	}, func(ctx *fasthttp.RequestCtx, status int, msg string) {
		fastserve.WriteJSON(ctx, status, map[string]any{"error": msg})
	})
}
