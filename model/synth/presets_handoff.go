package synth

// deepseek-v3.2-tiny-61: the tiny DeepSeek-V3.2 with the real model's 61
// layers (+ MTP), so a prefill -> decode hand-off moves the real state bytes
// per token (62 x (656 + 132)) while the weights stay small: the connector
// sidecar's hand-off benchmark on the H200 (roles/prefillshim).
func init() {
	p := presets["deepseek-v3.2-tiny"]
	p.Name = "deepseek-v3.2-tiny-61"
	p.Description = "tiny DeepSeek-V3.2 with the real 61 layers + MTP: the real hand-off bytes per token (benchmarks)"
	p.NumLayers = 61
	presets[p.Name] = p
}
