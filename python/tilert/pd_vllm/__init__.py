"""vLLM prefill/decode integration: prefill_connector.TileRTConnector."""
