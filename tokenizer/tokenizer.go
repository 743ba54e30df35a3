// Package tokenizer loads HF tokenizer.json files of the byte-level BPE kind
// (DeepSeek-V3/V3.2, GLM-4.x/GLM-5), encodes and decodes text exactly like
// the HF tokenizers library, detokenises incrementally for streaming, and
// builds tiny deterministic synthetic tokenizers for tests.
//
// Parity with HF tokenizers is tested on fixed and random text (see
// tokenizer_test.go). Known limits: characters first assigned in Unicode 16
// are classed by Go's Unicode 15 tables (HF's Oniguruma knows 16); HF's NFC
// uses older tables than golang.org/x/text; invalid UTF-8 input (which HF
// cannot receive) becomes U+FFFD; pre-tokenizer regexes other than the
// DeepSeek-V3, GLM/Llama-3 and GPT-2 ones run on regexp2, whose (?i) does not
// fold U+017F to "s" as Oniguruma does.
package tokenizer

import (
	"encoding/json"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"unicode/utf8"

	"github.com/cockroachdb/errors"
	"golang.org/x/text/unicode/norm"
)

// Tokenizer is safe for concurrent use.
type Tokenizer struct {
	vocab     map[string]int // token string -> id, model vocab and added tokens
	idToToken []string       // "" for ids nobody uses
	idBytes   [][]byte       // what each id decodes to (ByteLevel decoder rule)
	idStr     []string       // idBytes as a string when it is whole valid UTF-8
	special   []bool

	addedRaw  *addedMatcher // added tokens matched on the raw text
	addedNorm *addedMatcher // added tokens matched after normalisation
	normalize func(string) string
	pretok    []splitter
	bpe       *bpeModel

	// post-processing for addSpecial
	prefix, suffix []int

	bos int
	eos []int
	cfg Config
}

// Config is what tokenizer_config.json and generation_config.json add.
type Config struct {
	BOSToken, EOSToken string
	// AddBOS/AddEOS are nil when tokenizer_config.json does not say.
	AddBOS, AddEOS *bool
	ChatTemplate   string
	// GenerationEOS is generation_config.json's eos_token_id (int or list).
	GenerationEOS []int
	GenerationBOS *int
}

// Load reads dir/tokenizer.json and, when present, dir/tokenizer_config.json
// and dir/generation_config.json.
func Load(dir string) (*Tokenizer, error) {
	tj := filepath.Join(dir, "tokenizer.json")
	data, err := os.ReadFile(tj)
	if err != nil {
		return nil, errors.WithHint(errors.Wrapf(err, "reading %s", tj),
			"the model directory must contain an HF tokenizer.json")
	}
	var tc, gc []byte
	if tc, err = readOptional(filepath.Join(dir, "tokenizer_config.json")); err != nil {
		return nil, err
	}
	if gc, err = readOptional(filepath.Join(dir, "generation_config.json")); err != nil {
		return nil, err
	}
	t, err := Parse(data, tc, gc)
	if err != nil {
		return nil, errors.Wrapf(err, "loading tokenizer from %s", dir)
	}
	return t, nil
}

func readOptional(path string) ([]byte, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, errors.Wrapf(err, "reading %s", path)
	}
	return b, nil
}

// Parse builds a Tokenizer from the contents of tokenizer.json and the
// optional tokenizer_config.json and generation_config.json (nil if absent).
func Parse(tokenizerJSON, tokenizerConfig, generationConfig []byte) (*Tokenizer, error) {
	var f fileJSON
	if err := json.Unmarshal(tokenizerJSON, &f); err != nil {
		return nil, errors.Wrap(err, "tokenizer.json is not valid JSON")
	}
	t := &Tokenizer{vocab: map[string]int{}, bos: -1}
	if err := t.initModel(&f); err != nil {
		return nil, errors.Wrap(err, "tokenizer.json")
	}
	if err := t.initNormalizer(f.Normalizer); err != nil {
		return nil, errors.Wrap(err, "tokenizer.json")
	}
	pt, err := parsePreTokenizer(f.PreTokenizer)
	if err != nil {
		return nil, errors.Wrap(err, "tokenizer.json")
	}
	t.pretok = pt
	if err := checkDecoder(f.Decoder); err != nil {
		return nil, errors.Wrap(err, "tokenizer.json")
	}
	if err := t.initPost(f.PostProcessor); err != nil {
		return nil, errors.Wrap(err, "tokenizer.json")
	}
	if err := t.initConfig(tokenizerConfig, generationConfig); err != nil {
		return nil, err
	}
	return t, nil
}

func (t *Tokenizer) initModel(f *fileJSON) error {
	m := f.Model
	if m.Type != "BPE" && !(m.Type == "" && m.Vocab != nil) {
		return errors.Newf("model.type %q is not supported (only BPE)", m.Type)
	}
	if m.Dropout != nil && *m.Dropout > 0 {
		return errors.Newf("model.dropout %v is not supported at inference", *m.Dropout)
	}
	if (m.ContinuingSubwordPrefix != nil && *m.ContinuingSubwordPrefix != "") ||
		(m.EndOfWordSuffix != nil && *m.EndOfWordSuffix != "") {
		return errors.New("model.continuing_subword_prefix/end_of_word_suffix are not supported (not byte-level BPE)")
	}
	if m.ByteFallback {
		return errors.New("model.byte_fallback is not supported (not byte-level BPE)")
	}
	maxID := -1
	for tok, id := range m.Vocab {
		if id < 0 {
			return errors.Newf("model.vocab[%q] has negative id %d", tok, id)
		}
		t.vocab[tok] = id
		maxID = max(maxID, id)
	}
	added := make([]*addedToken, 0, len(f.AddedTokens))
	for i, a := range f.AddedTokens {
		if a.ID < 0 {
			return errors.Newf("added_tokens[%d] %q has negative id", i, a.Content)
		}
		added = append(added, &addedToken{id: a.ID, content: a.Content, special: a.Special,
			normalized: a.Normalized, singleWord: a.SingleWord, lstrip: a.LStrip, rstrip: a.RStrip})
		maxID = max(maxID, a.ID)
	}
	t.idToToken = make([]string, maxID+1)
	t.idBytes = make([][]byte, maxID+1)
	t.special = make([]bool, maxID+1)
	bm := &bpeModel{merges: map[uint64]mergeVal{}, ignoreMerges: m.IgnoreMerges,
		byteVocab: map[string]int32{}, cache: map[string][]int32{}}
	for tok, id := range m.Vocab {
		t.idToToken[id] = tok
		b, ok := tokenBytes(tok)
		t.idBytes[id] = b
		if ok {
			bm.byteVocab[string(b)] = int32(id)
		}
	}
	for _, a := range added {
		t.idToToken[a.id] = a.content
		t.idBytes[a.id], _ = tokenBytes(a.content)
		t.special[a.id] = a.special
		t.vocab[a.content] = a.id
	}
	for b := 0; b < 256; b++ {
		bm.byteID[b] = -1
		if id, ok := m.Vocab[string(byteToRune[b])]; ok {
			bm.byteID[b] = int32(id)
		}
	}
	merges, err := parseMerges(m.Merges)
	if err != nil {
		return err
	}
	for rank, p := range merges {
		a, okA := m.Vocab[p[0]]
		b, okB := m.Vocab[p[1]]
		n, okN := m.Vocab[p[0]+p[1]]
		if !okA || !okB || !okN {
			return errors.Newf("model.merges[%d] %q + %q: a part or the result is not in model.vocab", rank, p[0], p[1])
		}
		k := pairKey(int32(a), int32(b))
		if _, dup := bm.merges[k]; !dup { // HF keeps the first rank of a repeated merge
			bm.merges[k] = mergeVal{rank: int32(rank), newID: int32(n)}
		}
	}
	t.bpe = bm
	t.idStr = make([]string, len(t.idBytes))
	for id, b := range t.idBytes {
		if b != nil && utf8.Valid(b) {
			t.idStr[id] = string(b)
		}
	}
	var raw, normd []*addedToken
	for _, a := range added {
		if a.normalized {
			normd = append(normd, a)
		} else {
			raw = append(raw, a)
		}
	}
	t.addedRaw = newAddedMatcher(raw)
	t.addedNorm = newAddedMatcher(normd)
	return nil
}

func (t *Tokenizer) initNormalizer(raw json.RawMessage) error {
	if isNull(raw) {
		return nil
	}
	var fs []func(string) string
	var walk func(raw json.RawMessage) error
	walk = func(raw json.RawMessage) error {
		var n normalizerJSON
		if err := json.Unmarshal(raw, &n); err != nil {
			return errors.Wrap(err, "normalizer")
		}
		switch n.Type {
		case "Sequence":
			for _, s := range n.Normalizers {
				if err := walk(s); err != nil {
					return err
				}
			}
		case "NFC":
			fs = append(fs, norm.NFC.String)
		case "NFD":
			fs = append(fs, norm.NFD.String)
		case "NFKC":
			fs = append(fs, norm.NFKC.String)
		case "NFKD":
			fs = append(fs, norm.NFKD.String)
		default:
			return errors.Newf("normalizer type %q is not supported", n.Type)
		}
		return nil
	}
	if err := walk(raw); err != nil {
		return err
	}
	switch len(fs) {
	case 0:
	case 1:
		t.normalize = fs[0]
	default:
		t.normalize = func(s string) string {
			for _, f := range fs {
				s = f(s)
			}
			return s
		}
	}
	return nil
}

func checkDecoder(raw json.RawMessage) error {
	if isNull(raw) {
		return errors.New("decoder is null; only the ByteLevel decoder is supported")
	}
	var d decoderJSON
	if err := json.Unmarshal(raw, &d); err != nil {
		return errors.Wrap(err, "decoder")
	}
	switch d.Type {
	case "ByteLevel":
		return nil
	case "Sequence":
		if len(d.Decoders) == 1 {
			return checkDecoder(d.Decoders[0])
		}
	}
	return errors.Newf("decoder type %q is not supported (only ByteLevel)", d.Type)
}

func (t *Tokenizer) initPost(raw json.RawMessage) error {
	if isNull(raw) {
		return nil
	}
	var p postJSON
	if err := json.Unmarshal(raw, &p); err != nil {
		return errors.Wrap(err, "post_processor")
	}
	switch p.Type {
	case "ByteLevel": // offsets only
		return nil
	case "Sequence":
		for _, sub := range p.Processors {
			if err := t.initPost(sub); err != nil {
				return err
			}
		}
		return nil
	case "TemplateProcessing":
		seen := false
		for _, piece := range p.Single {
			switch {
			case piece.Sequence != nil:
				if seen {
					return errors.New("post_processor: single template has two sequences")
				}
				seen = true
			case piece.SpecialToken != nil:
				st, ok := p.SpecialTokens[piece.SpecialToken.ID]
				if !ok {
					return errors.Newf("post_processor: special token %q has no entry in special_tokens", piece.SpecialToken.ID)
				}
				if seen {
					t.suffix = append(t.suffix, st.IDs...)
				} else {
					t.prefix = append(t.prefix, st.IDs...)
				}
			}
		}
		return nil
	}
	return errors.Newf("post_processor type %q is not supported", p.Type)
}

// tokenName accepts "<s>" or {"content": "<s>", ...} (AddedToken form).
func tokenName(raw json.RawMessage) (string, error) {
	if isNull(raw) {
		return "", nil
	}
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		return s, nil
	}
	var o struct {
		Content string `json:"content"`
	}
	if err := json.Unmarshal(raw, &o); err != nil {
		return "", errors.Newf("neither a string nor {\"content\": ...}: %s", raw)
	}
	return o.Content, nil
}

// intOrList accepts 7 or [7, 8].
func intOrList(raw json.RawMessage) ([]int, error) {
	if isNull(raw) {
		return nil, nil
	}
	var one int
	if err := json.Unmarshal(raw, &one); err == nil {
		return []int{one}, nil
	}
	var many []int
	if err := json.Unmarshal(raw, &many); err != nil {
		return nil, errors.Newf("neither an int nor a list of ints: %s", raw)
	}
	return many, nil
}

func (t *Tokenizer) initConfig(tc, gc []byte) error {
	if tc != nil {
		var c struct {
			BOS          json.RawMessage `json:"bos_token"`
			EOS          json.RawMessage `json:"eos_token"`
			AddBOS       *bool           `json:"add_bos_token"`
			AddEOS       *bool           `json:"add_eos_token"`
			ChatTemplate json.RawMessage `json:"chat_template"`
		}
		if err := json.Unmarshal(tc, &c); err != nil {
			return errors.Wrap(err, "tokenizer_config.json is not valid JSON")
		}
		var err error
		if t.cfg.BOSToken, err = tokenName(c.BOS); err != nil {
			return errors.Wrap(err, "tokenizer_config.json: bos_token")
		}
		if t.cfg.EOSToken, err = tokenName(c.EOS); err != nil {
			return errors.Wrap(err, "tokenizer_config.json: eos_token")
		}
		t.cfg.AddBOS, t.cfg.AddEOS = c.AddBOS, c.AddEOS
		if !isNull(c.ChatTemplate) {
			// a string, or a list of {name, template}; keep the default one
			var s string
			if err := json.Unmarshal(c.ChatTemplate, &s); err != nil {
				var named []struct{ Name, Template string }
				if err := json.Unmarshal(c.ChatTemplate, &named); err != nil {
					return errors.Wrap(err, "tokenizer_config.json: chat_template")
				}
				for _, n := range named {
					if n.Name == "default" || s == "" {
						s = n.Template
					}
				}
			}
			t.cfg.ChatTemplate = s
		}
	}
	if gc != nil {
		var g struct {
			BOS *int            `json:"bos_token_id"`
			EOS json.RawMessage `json:"eos_token_id"`
		}
		if err := json.Unmarshal(gc, &g); err != nil {
			return errors.Wrap(err, "generation_config.json is not valid JSON")
		}
		ids, err := intOrList(g.EOS)
		if err != nil {
			return errors.Wrap(err, "generation_config.json: eos_token_id")
		}
		t.cfg.GenerationEOS, t.cfg.GenerationBOS = ids, g.BOS
	}
	if t.cfg.BOSToken != "" {
		id, ok := t.vocab[t.cfg.BOSToken]
		if !ok {
			return errors.Newf("tokenizer_config.json: bos_token %q is not in tokenizer.json", t.cfg.BOSToken)
		}
		t.bos = id
	} else if t.cfg.GenerationBOS != nil {
		t.bos = *t.cfg.GenerationBOS
	}
	if t.cfg.EOSToken != "" {
		id, ok := t.vocab[t.cfg.EOSToken]
		if !ok {
			return errors.Newf("tokenizer_config.json: eos_token %q is not in tokenizer.json", t.cfg.EOSToken)
		}
		t.eos = append(t.eos, id)
	}
	for _, id := range t.cfg.GenerationEOS {
		if !containsInt(t.eos, id) {
			t.eos = append(t.eos, id)
		}
	}
	// Explicit add_bos_token/add_eos_token win over tokenizer.json's template,
	// as transformers' Llama-style fast tokenizers rebuild the template from them.
	if t.cfg.AddBOS != nil {
		t.prefix = nil
		if *t.cfg.AddBOS && t.bos >= 0 {
			t.prefix = []int{t.bos}
		}
	}
	if t.cfg.AddEOS != nil {
		t.suffix = nil
		if *t.cfg.AddEOS && t.cfg.EOSToken != "" {
			t.suffix = []int{t.vocab[t.cfg.EOSToken]}
		}
	}
	return nil
}

func containsInt(s []int, v int) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

// Encode turns text into ids. addSpecial applies the post-processor
// template (e.g. a BOS prefix), as HF's add_special_tokens does. Invalid
// UTF-8 is replaced by U+FFFD first (HF only accepts valid text).
func (t *Tokenizer) Encode(text string, addSpecial bool) ([]int, error) {
	ids := make([]int, 0, len(text)/3+4)
	if addSpecial {
		ids = append(ids, t.prefix...)
	}
	ids = t.AppendEncode(ids, text)
	if addSpecial {
		ids = append(ids, t.suffix...)
	}
	return ids, nil
}

// AppendEncode appends the ids of text (no special-token template) to dst.
func (t *Tokenizer) AppendEncode(dst []int, text string) []int {
	if !utf8ValidString(text) {
		text = strings.ToValidUTF8(text, "\uFFFD")
	}
	var segBuf [8]segment
	segs := t.addedRaw.split(segBuf[:0], text)
	var words []string
	for _, s := range segs {
		if s.id >= 0 {
			dst = append(dst, s.id)
			continue
		}
		txt := s.text
		if t.normalize != nil {
			txt = t.normalize(txt)
		}
		var sub [8]segment
		for _, s2 := range t.addedNorm.split(sub[:0], txt) {
			if s2.id >= 0 {
				dst = append(dst, s2.id)
				continue
			}
			words = t.preTokenize(words[:0], s2.text)
			for _, w := range words {
				dst = t.bpe.encodeWord(dst, w)
			}
		}
	}
	return dst
}

// preTokenize runs the splitter chain over s.
func (t *Tokenizer) preTokenize(dst []string, s string) []string {
	cur := append(dst, s)
	var next []string
	for _, sp := range t.pretok {
		next = next[:0]
		for _, p := range cur {
			next = sp.split(next, p)
		}
		cur, next = next, cur
	}
	return cur
}

// VocabSize is one more than the largest id in the model vocab or the added
// tokens: the size of an embedding table that covers every id.
func (t *Tokenizer) VocabSize() int { return len(t.idToToken) }

// TokenID looks a token string up among added tokens and the vocab.
func (t *Tokenizer) TokenID(s string) (int, bool) {
	id, ok := t.vocab[s]
	return id, ok
}

// Token returns the token string of id ("" and false if unused).
func (t *Tokenizer) Token(id int) (string, bool) {
	if id < 0 || id >= len(t.idToToken) || t.idToToken[id] == "" {
		return "", false
	}
	return t.idToToken[id], true
}

// IsSpecial reports whether id is an added token marked special.
func (t *Tokenizer) IsSpecial(id int) bool {
	return id >= 0 && id < len(t.special) && t.special[id]
}

// SpecialIDs lists the ids of special added tokens, ascending.
func (t *Tokenizer) SpecialIDs() []int {
	var out []int
	for id, s := range t.special {
		if s {
			out = append(out, id)
		}
	}
	sort.Ints(out)
	return out
}

// BOS is the bos token id, or -1 when the model has none.
func (t *Tokenizer) BOS() int { return t.bos }

// EOS lists the ids that end generation: tokenizer_config's eos_token first,
// then generation_config's eos_token_id entries.
func (t *Tokenizer) EOS() []int { return append([]int(nil), t.eos...) }

// ChatTemplate is tokenizer_config.json's raw Jinja chat_template ("" if none).
func (t *Tokenizer) ChatTemplate() string { return t.cfg.ChatTemplate }

// Config returns what was read from tokenizer_config.json and generation_config.json.
func (t *Tokenizer) Config() Config { return t.cfg }

// idText is the text of id when its bytes are whole characters.
func (t *Tokenizer) idText(id int) (string, bool) {
	s := t.idStr[id]
	return s, s != "" || len(t.idBytes[id]) == 0
}
