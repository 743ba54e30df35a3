package engine

import "github.com/cockroachdb/errors"

// CheckTokens reports the first id outside [0, vocab).
func CheckTokens(vocab int, toks ...int) error {
	for _, t := range toks {
		if t < 0 || t >= vocab {
			return errors.Wrapf(ErrBadTokenID, "token %d (vocab %d)", t, vocab)
		}
	}
	return nil
}

// CheckImport validates the state handed to Import before any byte of it is
// used, the same way on every backend: sequence length within the engine's
// limit, MTP entries present when speculation is on, a valid last token, and
// segments inside a slot buffer of slotBytes.
func CheckImport(meta SlotMeta, segs []Segment, maxSeq, vocab int, mtp bool, slotBytes int64) error {
	if meta.SeqLen < 1 || meta.SeqLen >= maxSeq {
		return errors.Wrapf(ErrTooLong, "import seq_len %d (max_seq_len %d)", meta.SeqLen, maxSeq)
	}
	if meta.MTPLen < 0 || meta.MTPLen > meta.SeqLen {
		return errors.Wrapf(ErrBadLayout, "import mtp_len %d with seq_len %d", meta.MTPLen, meta.SeqLen)
	}
	if mtp && meta.MTPLen < meta.SeqLen-1 {
		return errors.WithHint(errors.Wrapf(ErrBadLayout, "import mtp_len %d with seq_len %d: the MTP layer's cache is incomplete", meta.MTPLen, meta.SeqLen),
			"run vLLM with --speculative-config '{\"method\":\"mtp\",\"num_speculative_tokens\":1}' so the draft layer's cache exists")
	}
	if err := CheckTokens(vocab, meta.LastToken); err != nil {
		return err
	}
	for _, sg := range segs {
		if sg.Offset < 0 || sg.Offset+int64(len(sg.Data)) > slotBytes {
			return errors.Wrapf(ErrBadLayout, "segment [%d,+%d) outside the %d-byte slot buffer", sg.Offset, len(sg.Data), slotBytes)
		}
	}
	return nil
}
