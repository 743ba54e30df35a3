package tokenizer

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"flag"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"

	"golang.org/x/text/unicode/norm"
)

var update = flag.Bool("update", false, "regenerate testdata/hf_ids.json with the HF tokenizers library")

var (
	dsSpecials  = []string{"<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>", "<think>", "</think>"}
	glmSpecials = []string{"<|endoftext|>", "[MASK]", "[gMASK]", "[sMASK]", "<sop>", "<eop>", "<|system|>", "<|user|>", "<|assistant|>", "<|observation|>"}
)

// texts exercises every branch of the pre-tokenizer patterns.
var texts = []string{
	"",
	"Hello world",
	"Hello, world! How are you today? I'm fine; it's what we'll use, they've said I'D go.",
	"The quick brown fox jumps over the lazy dog 1234567890 times.",
	"  leading spaces,\ttabs,\nnewlines\r\nand   runs   of   spaces  ",
	"trailing spaces   ",
	"\n\n\n",
	" \n \n",
	"a\u00a0b\u3000c\u2028d\u0085e\u2009f\u200bg",
	"12 345 6789 1234567 3.14159 -17 +42 1e-9 0x1F ١٢٣٤ ⅣⅤ ²³",
	"人工智能正在改变我们的生活方式。今天天气很好！",
	"東京は日本の首都です。ひらがなカタカナ漢字ｶﾀｶﾅ",
	"한국어 문장도 있습니다. 서울은 한국의 수도",
	"Привет, мир! Ελληνικά κείμενα. עברית ועוד. العربية",
	"नमस्ते दुनिया क्षत्रिय",
	"e\u0301 (combining) vs \u00e9 (precomposed) and Å vs A\u030a",
	"Emoji 😀😂🚀 👍🏽 ❤️ 🇯🇵 👩‍💻 family 👨‍👩‍👧‍👦",
	"Symbols €£¥ © ® ™ ∑ ∫ √ ∞ ≠ ≤ → «quotes» „German“ 'single'",
	"def f(x):\n    return {'a': [1, 2, 3]}  # comment\n\n\nprint(f(0))\n",
	"func main() {\n\tfmt.Println(\"hi\") // tab indented\n}\n",
	"if (a&&b||!c) { x += y->z; } else { return -1; }",
	"<div class=\"note\"><p>Save &amp; close</p></div>",
	"URLs like https://example.com/path?q=1&r=2#frag and e-mail@example.org",
	"$HOME/.config/app.toml ~/src/*.go C:\\Users\\x\\file.txt",
	"<｜begin▁of▁sentence｜>Hello<｜User｜>hi<｜Assistant｜><think>\nhmm\n</think>\n\nok<｜end▁of▁sentence｜>",
	"[gMASK]<sop><|system|>\nYou are helpful.<|user|>\nHi<|assistant|>\nHello<|endoftext|>",
	"special tokens glued: x<|user|>y <|user|> z<|endoftext|><|endoftext|>",
	"almost special: <|user| and <｜end▁of▁sentence and [gMAS",
	"MiXeD CaSe WORDS and camelCaseIdentifiers snake_case_names SCREAMING_CASE",
	"don't DON'T can't it'S you'Re we'VE I'm I'M they'll THEY'LL he'd",
	"...!!!??? --- === *** ### @@@ ~~~ ``` '''",
	"tab\tseparated\tvalues\t1\t2\t3",
	"Zero\u200dwidth\u200cjoiners and \ufeffBOM and soft\u00adhyphen",
	"\x00\x01\x1f control \x7f chars",
	"ﬁ ligature, full-width ＡＢＣ１２３, half-width ｱｲｳ",
	"Tiếng Việt có nhiều dấu thanh. İstanbul Türkiye. Grüße aus München.",
	"สวัสดีชาวโลก ภาษาไทย",
	"𝔘𝔫𝔦𝔠𝔬𝔡𝔢 math 𝐛𝐨𝐥𝐝 and 𠀀𠀁 (CJK ext B)",
	"a b  c   d    e     f",
	"line1\r\nline2\rline3\n\r\nend",
	"case folding: it'ſa IT'ſABC 'ﬅ x'Kay",
}

type synthCase struct {
	name    string
	vocab   int
	seed    int64
	special []string
	style   Style
	tweak   func(m map[string]any) // edits the JSON to cover more loader features
}

var synthCases = []synthCase{
	{name: "deepseek", vocab: 1024, seed: 1, special: dsSpecials},
	{name: "glm", vocab: 1024, seed: 2, special: glmSpecials},
	{name: "gpt2-variant", vocab: 700, seed: 3, special: []string{"<|bos|>", "<|eos|>"}, style: StyleDeepSeek, tweak: gpt2Variant},
}

// gpt2Variant turns a synthetic tokenizer into one using the other supported
// features: NFC, Digits + ByteLevel(use_regex) pre-tokenizer, "a b" merges,
// ignore_merges, add_prefix_space, a normalized non-special added token
// with lstrip/rstrip, and a template.
func gpt2Variant(m map[string]any) {
	m["normalizer"] = map[string]any{"type": "Sequence", "normalizers": []any{map[string]any{"type": "NFC"}}}
	m["pre_tokenizer"] = map[string]any{"type": "Sequence", "pretokenizers": []any{
		map[string]any{"type": "Digits", "individual_digits": true},
		map[string]any{"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
	}}
	model := m["model"].(map[string]any)
	model["ignore_merges"] = true
	var merges []any
	for _, p := range model["merges"].([]any) {
		pp := p.([]any)
		merges = append(merges, pp[0].(string)+" "+pp[1].(string))
	}
	model["merges"] = merges
	added := m["added_tokens"].([]any)
	added = append(added, map[string]any{"id": 700, "content": "<tool>", "single_word": false,
		"lstrip": true, "rstrip": true, "normalized": true, "special": false})
	m["added_tokens"] = added
	m["post_processor"] = map[string]any{"type": "TemplateProcessing",
		"single": []any{map[string]any{"SpecialToken": map[string]any{"id": "<|bos|>", "type_id": 0}},
			map[string]any{"Sequence": map[string]any{"id": "A", "type_id": 0}},
			map[string]any{"SpecialToken": map[string]any{"id": "<|eos|>", "type_id": 0}}},
		"pair":           []any{},
		"special_tokens": map[string]any{"<|bos|>": map[string]any{"id": "<|bos|>", "ids": []any{698}, "tokens": []any{"<|bos|>"}}, "<|eos|>": map[string]any{"id": "<|eos|>", "ids": []any{699}, "tokens": []any{"<|eos|>"}}},
	}
}

func buildCase(t testing.TB, c synthCase) []byte {
	t.Helper()
	b, err := BuildSyntheticWith(SyntheticOptions{VocabSize: c.vocab, Specials: c.special, Seed: c.seed, Style: c.style})
	if err != nil {
		t.Fatal(err)
	}
	if c.tweak != nil {
		var m map[string]any
		if err := json.Unmarshal(b, &m); err != nil {
			t.Fatal(err)
		}
		c.tweak(m)
		if b, err = json.MarshalIndent(m, "", " "); err != nil {
			t.Fatal(err)
		}
	}
	return b
}

func mustParse(t testing.TB, b []byte) *Tokenizer {
	t.Helper()
	tk, err := Parse(b, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	return tk
}

func TestRoundTrip(t *testing.T) {
	for _, c := range synthCases {
		tk := mustParse(t, buildCase(t, c))
		for _, text := range texts {
			ids, err := tk.Encode(text, false)
			if err != nil {
				t.Fatal(err)
			}
			want := strings.ToValidUTF8(text, "\uFFFD")
			if c.tweak != nil { // NFC normaliser
				continue
			}
			if got := tk.Decode(ids, false); got != want {
				t.Errorf("%s: round trip of %q gave %q (ids %v)", c.name, text, got, ids)
			}
		}
	}
}

func TestIncrementalDecoderMatchesDecode(t *testing.T) {
	tk := mustParse(t, buildCase(t, synthCases[0]))
	check := func(ids []int, skip bool) {
		var opts []DecoderOption
		if skip {
			opts = append(opts, SkipSpecial())
		}
		d := tk.NewDecoder(opts...)
		var sb strings.Builder
		for _, id := range ids {
			s := d.Add(id)
			if !utf8.ValidString(s) {
				t.Fatalf("Add emitted invalid UTF-8 %q", s)
			}
			sb.WriteString(s)
		}
		sb.WriteString(d.Flush())
		if want := tk.Decode(ids, skip); sb.String() != want {
			t.Fatalf("incremental %q != Decode %q for %v", sb.String(), want, ids)
		}
	}
	for _, text := range texts {
		ids, _ := tk.Encode(text, true)
		check(ids, false)
		check(ids, true)
	}
	// Random id streams hit every broken-UTF-8 shape.
	rng := rand.New(rand.NewPCG(7, 7))
	for i := 0; i < 3000; i++ {
		ids := make([]int, 1+rng.IntN(12))
		for j := range ids {
			if rng.IntN(4) == 0 {
				ids[j] = 0x80 + rng.IntN(0x80) // single bytes >= 0x80, mostly invalid alone
			} else {
				ids[j] = rng.IntN(tk.VocabSize() + 3) // includes unknown ids
			}
		}
		check(ids, rng.IntN(2) == 0)
	}
}

func TestDecoderHoldsSplitCharacter(t *testing.T) {
	tk := mustParse(t, buildCase(t, synthCases[0]))
	d := tk.NewDecoder()
	// "😀" is F0 9F 98 80; bytes 0..255 are ids 0..255 in synthetic tokenizers.
	for i, b := range []int{0xF0, 0x9F, 0x98} {
		if s := d.Add(b); s != "" {
			t.Fatalf("byte %d emitted %q before the character was whole", i, s)
		}
	}
	if s := d.Add(0x80); s != "😀" {
		t.Fatalf("got %q, want 😀", s)
	}
	d.Add(0xE4)
	if s := d.Add('a'); s != "\uFFFDa" {
		t.Fatalf("broken sequence gave %q", s)
	}
	d.Add(0xE4)
	if d.Pending() != 1 {
		t.Fatalf("pending %d", d.Pending())
	}
	if s := d.Flush(); s != "\uFFFD" {
		t.Fatalf("flush gave %q", s)
	}
}

func TestLossyMatchesMaximalSubpart(t *testing.T) {
	cases := []struct{ in, want string }{
		{"\xe2\x82", "\uFFFD"},
		{"\xe2\x82a", "\uFFFDa"},
		{"\xff\xfe", "\uFFFD\uFFFD"},
		{"\xed\xa0\x80", "\uFFFD\uFFFD\uFFFD"}, // surrogate: E0..9F only after ED
		{"\xf0\x9f\x98", "\uFFFD"},
		{"\xf4\x90\x80\x80", "\uFFFD\uFFFD\uFFFD\uFFFD"},
		{"\xc0\xaf", "\uFFFD\uFFFD"},
		{"ok\xe4\xbd\xa0", "ok你"},
	}
	for _, c := range cases {
		got, _ := appendLossy(nil, []byte(c.in), true)
		if string(got) != c.want {
			t.Errorf("%q: got %q want %q", c.in, got, c.want)
		}
	}
}

func TestSyntheticDeterministic(t *testing.T) {
	a, err := BuildSynthetic(600, glmSpecials, 5)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := BuildSynthetic(600, glmSpecials, 5)
	c, _ := BuildSynthetic(600, glmSpecials, 6)
	if string(a) != string(b) {
		t.Fatal("same inputs gave different bytes")
	}
	if string(a) == string(c) {
		t.Fatal("the seed changes nothing")
	}
	tk := mustParse(t, a)
	if tk.VocabSize() != 600 {
		t.Fatalf("vocab size %d", tk.VocabSize())
	}
	for i, s := range glmSpecials {
		if id, ok := tk.TokenID(s); !ok || id != 600-len(glmSpecials)+i || !tk.IsSpecial(id) {
			t.Fatalf("special %q id %d ok %v", s, id, ok)
		}
	}
	if _, err := BuildSynthetic(100, nil, 0); err == nil {
		t.Fatal("vocab below 256 accepted")
	}
	if _, err := BuildSynthetic(1000, []string{"<a>", "<a>"}, 0); err == nil {
		t.Fatal("repeated special accepted")
	}
}

func TestLoadDirConfig(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "tokenizer.json"), buildCase(t, synthCases[0]), 0o644); err != nil {
		t.Fatal(err)
	}
	tc := `{"add_bos_token": true, "add_eos_token": false,
 "bos_token": {"__type": "AddedToken", "content": "<｜begin▁of▁sentence｜>", "lstrip": false},
 "eos_token": "<｜end▁of▁sentence｜>", "chat_template": "{% for m in messages %}{{ m.content }}{% endfor %}"}`
	gc := `{"bos_token_id": 1018, "eos_token_id": [1019, 1021]}`
	os.WriteFile(filepath.Join(dir, "tokenizer_config.json"), []byte(tc), 0o644)
	os.WriteFile(filepath.Join(dir, "generation_config.json"), []byte(gc), 0o644)
	tk, err := Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	if tk.BOS() != 1018 {
		t.Errorf("BOS %d", tk.BOS())
	}
	if got := tk.EOS(); !reflect.DeepEqual(got, []int{1019, 1021}) {
		t.Errorf("EOS %v", got)
	}
	if !strings.HasPrefix(tk.ChatTemplate(), "{% for m") {
		t.Errorf("chat template %q", tk.ChatTemplate())
	}
	ids, _ := tk.Encode("hi", true)
	if ids[0] != 1018 {
		t.Errorf("add_bos_token ignored: %v", ids)
	}
	// generation_config's single int form, and no tokenizer_config
	os.Remove(filepath.Join(dir, "tokenizer_config.json"))
	os.WriteFile(filepath.Join(dir, "generation_config.json"), []byte(`{"eos_token_id": 1019}`), 0o644)
	if tk, err = Load(dir); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(tk.EOS(), []int{1019}) || tk.BOS() != -1 {
		t.Errorf("EOS %v BOS %d", tk.EOS(), tk.BOS())
	}
	if _, err := Load(t.TempDir()); err == nil || !strings.Contains(err.Error(), "tokenizer.json") {
		t.Errorf("missing file error %v", err)
	}
}

func TestLoadRejects(t *testing.T) {
	base := buildCase(t, synthCases[0])
	bad := []struct {
		name string
		edit func(m map[string]any)
	}{
		{"unigram", func(m map[string]any) { m["model"].(map[string]any)["type"] = "Unigram" }},
		{"merge out of vocab", func(m map[string]any) {
			md := m["model"].(map[string]any)
			md["merges"] = append(md["merges"].([]any), []any{"zzzq", "qq"})
		}},
		{"whitespace pretok", func(m map[string]any) { m["pre_tokenizer"] = map[string]any{"type": "Whitespace"} }},
		{"no bytelevel", func(m map[string]any) {
			m["pre_tokenizer"] = map[string]any{"type": "Digits", "individual_digits": true}
		}},
		{"wordpiece decoder", func(m map[string]any) { m["decoder"] = map[string]any{"type": "WordPiece"} }},
		{"bad regex", func(m map[string]any) {
			m["pre_tokenizer"] = map[string]any{"type": "Sequence", "pretokenizers": []any{
				map[string]any{"type": "Split", "pattern": map[string]any{"Regex": "(unclosed"}, "behavior": "Isolated", "invert": false},
				map[string]any{"type": "ByteLevel"}}}
		}},
		{"split removed", func(m map[string]any) {
			m["pre_tokenizer"] = map[string]any{"type": "Sequence", "pretokenizers": []any{
				map[string]any{"type": "Split", "pattern": map[string]any{"Regex": "a"}, "behavior": "Removed", "invert": false},
				map[string]any{"type": "ByteLevel"}}}
		}},
	}
	for _, c := range bad {
		var m map[string]any
		json.Unmarshal(base, &m)
		c.edit(m)
		b, _ := json.Marshal(m)
		if _, err := Parse(b, nil, nil); err == nil {
			t.Errorf("%s: accepted", c.name)
		} else {
			t.Logf("%s: %v", c.name, err)
		}
	}
	if _, err := Parse(base, []byte(`{"eos_token": "<nope>"}`), nil); err == nil {
		t.Error("unknown eos_token accepted")
	}
}

// ---- cross-check against HF tokenizers ----

type hfOut struct {
	Versions map[string]string `json:"versions"`
	Results  map[string]struct {
		IDs         [][]int    `json:"ids"`
		IDsSpecial  [][]int    `json:"ids_special"`
		Decoded     []string   `json:"decoded"`
		DecodedSkip []string   `json:"decoded_skip"`
		Pretok      [][]string `json:"pretok"`
	} `json:"results"`
}

type golden struct {
	hfOut
	Texts  []string          `json:"texts"`
	SHA256 map[string]string `json:"sha256"`
}

func pythonPath() string {
	if p := os.Getenv("TILERT_PYTHON"); p != "" {
		return p
	}
	return "/work/pyenv/bin/python"
}

func hasHF() bool {
	return exec.Command(pythonPath(), "-c", "import tokenizers").Run() == nil
}

// runHF writes the tokenizers and texts to a temp dir and runs hf_ids.py.
func runHF(t *testing.T, toks map[string][]byte, texts []string) hfOut {
	t.Helper()
	dir := t.TempDir()
	req := map[string]any{"texts": texts}
	paths := map[string]string{}
	for name, b := range toks {
		p := filepath.Join(dir, name+".json")
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
		paths[name] = p
	}
	req["tokenizers"] = paths
	rb, _ := json.Marshal(req)
	in := filepath.Join(dir, "req.json")
	out := filepath.Join(dir, "out.json")
	os.WriteFile(in, rb, 0o644)
	cmd := exec.Command(pythonPath(), filepath.Join("testdata", "hf_ids.py"), "--in", in, "--out", out)
	if msg, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("hf_ids.py: %v\n%s", err, msg)
	}
	ob, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	var o hfOut
	if err := json.Unmarshal(ob, &o); err != nil {
		t.Fatal(err)
	}
	return o
}

func synthTokenizers(t testing.TB) map[string][]byte {
	m := map[string][]byte{}
	for _, c := range synthCases {
		m[c.name] = buildCase(t, c)
	}
	return m
}

func compareHF(t *testing.T, toks map[string][]byte, texts []string, o hfOut) {
	t.Helper()
	for name, b := range toks {
		tk := mustParse(t, b)
		r, ok := o.Results[name]
		if !ok {
			t.Fatalf("no HF results for %s", name)
		}
		for i, text := range texts {
			var pieces []string
			for _, p := range tk.preTokenize(nil, strings.ToValidUTF8(text, "\uFFFD")) {
				pieces = append(pieces, byteLevelString([]byte(p)))
			}
			if len(pieces) != len(r.Pretok[i]) || (len(pieces) > 0 && !reflect.DeepEqual(pieces, r.Pretok[i])) {
				t.Errorf("%s: pre-tokenize %q\n go %q\n hf %q", name, text, pieces, r.Pretok[i])
			}
			ids, _ := tk.Encode(text, false)
			if !slices.Equal(ids, r.IDs[i]) {
				t.Errorf("%s: encode %q\n go %v\n hf %v", name, text, ids, r.IDs[i])
				continue
			}
			ids, _ = tk.Encode(text, true)
			if !slices.Equal(ids, r.IDsSpecial[i]) {
				t.Errorf("%s: encode+special %q\n go %v\n hf %v", name, text, ids, r.IDsSpecial[i])
			}
			if got := tk.Decode(r.IDsSpecial[i], false); got != r.Decoded[i] {
				t.Errorf("%s: decode %v\n go %q\n hf %q", name, r.IDsSpecial[i], got, r.Decoded[i])
			}
			if got := tk.Decode(r.IDsSpecial[i], true); got != r.DecodedSkip[i] {
				t.Errorf("%s: decode skip %v\n go %q\n hf %q", name, r.IDsSpecial[i], got, r.DecodedSkip[i])
			}
		}
	}
}

func sha(b []byte) string { s := sha256.Sum256(b); return hex.EncodeToString(s[:]) }

const goldenPath = "testdata/hf_ids.json"

// TestGoldenHF compares against ids HF produced once (no Python needed).
// It also pins the synthetic tokenizer bytes: a changed builder must be
// regenerated on purpose with -update.
func TestGoldenHF(t *testing.T) {
	toks := synthTokenizers(t)
	if *update {
		if !hasHF() {
			t.Fatalf("-update needs the HF tokenizers library at %s (set TILERT_PYTHON)", pythonPath())
		}
		g := golden{hfOut: runHF(t, toks, texts), Texts: texts, SHA256: map[string]string{}}
		for n, b := range toks {
			g.SHA256[n] = sha(b)
		}
		b, err := json.MarshalIndent(g, "", " ")
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(goldenPath, append(b, '\n'), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	b, err := os.ReadFile(goldenPath)
	if err != nil {
		t.Fatalf("%v (regenerate with go test ./tokenizer -run GoldenHF -update)", err)
	}
	var g golden
	if err := json.Unmarshal(b, &g); err != nil {
		t.Fatal(err)
	}
	for n, tb := range toks {
		if g.SHA256[n] != sha(tb) {
			t.Errorf("synthetic tokenizer %s changed bytes (sha256 %s, golden %s); if intended, run -update", n, sha(tb), g.SHA256[n])
		}
	}
	compareHF(t, toks, g.Texts, g.hfOut)
	t.Logf("compared %d texts x %d tokenizers against HF tokenizers %s", len(g.Texts), len(toks), g.Versions["tokenizers"])
}

// randomTexts mixes the character classes the patterns distinguish.
func randomTexts(n int, seed uint64) []string {
	pool := []string{"a", "Z", "é", "ß", "中", "ぁ", "ア", "한", "ж", "ع", "ก", "\u0301", "\u093f", "1", "٣", "²", "Ⅳ",
		" ", "  ", "\t", "\n", "\r\n", "\r", "\u00a0", "\u3000", "\u2028", "\u0085", "\u200b", "\ufeff",
		".", ",", "!", "'", "'s", "'LL", "\"", "-", "_", "/", "\\", "(", "]", "{", "`", "~", "@", "#", "$", "€", "©", "+", "<", "=", "|",
		"😀", "👍🏽", "🇯🇵", "\u200d", "\x00", "\x1b", "ﬁ", "ſ", "'ſ", "Ａ", "ｱ", "𝐛", "𠀀",
		"the", "The", " world", "token", "1234", "3.14", "<|user|>", "<｜User｜>", "<think>", "[gMASK]", "<tool>"}
	rng := rand.New(rand.NewPCG(seed, 1))
	out := make([]string, n)
	for i := range out {
		var sb strings.Builder
		for k := 1 + rng.IntN(20); k > 0; k-- {
			sb.WriteString(pool[rng.IntN(len(pool))])
		}
		out[i] = sb.String()
	}
	return out
}

// TestLiveHF runs the HF library directly when the venv exists, on the fixed
// texts and on random ones.
func TestLiveHF(t *testing.T) {
	if !hasHF() {
		t.Skipf("no HF tokenizers at %s", pythonPath())
	}
	all := append(append([]string{}, texts...), randomTexts(1500, 11)...)
	n, seed := 3000, uint64(5)
	if v, err := strconv.Atoi(os.Getenv("TILERT_HF_RANDOM")); err == nil { // more, with a new seed
		n, seed = v, uint64(v)
	}
	rng := rand.New(rand.NewPCG(seed, 6))
	for len(all) < len(texts)+1500+n {
		// HF's NFC tables predate Unicode 14 (U+1ABF has no combining class
		// there), so random text that NFC would reorder is left out
		if s := randomRunes(rng, 1+rng.IntN(30)); norm.NFC.IsNormalString(s) {
			all = append(all, s)
		}
	}
	toks := synthTokenizers(t)
	compareHF(t, toks, all, runHF(t, toks, all))
}

// TestRealTokenizerVsHF checks real checkpoints' tokenizers when
// TILERT_REAL_TOKENIZERS lists directories (colon separated) holding a
// tokenizer.json; those files are never committed.
func TestRealTokenizerVsHF(t *testing.T) {
	dirs := os.Getenv("TILERT_REAL_TOKENIZERS")
	if dirs == "" || !hasHF() {
		t.Skip("set TILERT_REAL_TOKENIZERS=dir1:dir2 and have the HF venv")
	}
	toks := map[string][]byte{}
	for i, d := range strings.Split(dirs, ":") {
		b, err := os.ReadFile(filepath.Join(d, "tokenizer.json"))
		if err != nil {
			t.Fatal(err)
		}
		toks["real"+itoa(i)] = b
	}
	all := append(append([]string{}, texts...), randomTexts(1500, 12)...)
	compareHF(t, toks, all, runHF(t, toks, all))
}

func TestConcurrentEncode(t *testing.T) {
	tk := mustParse(t, buildCase(t, synthCases[1]))
	want := make([][]int, len(texts))
	for i, s := range texts {
		want[i], _ = tk.Encode(s, true)
	}
	tk = mustParse(t, buildCase(t, synthCases[1])) // cold cache
	errs := make(chan string, 8)
	for g := 0; g < 8; g++ {
		go func() {
			for k := range texts {
				i := (k + g*5) % len(texts)
				got, _ := tk.Encode(texts[i], true)
				if !slices.Equal(got, want[i]) {
					errs <- texts[i]
					return
				}
			}
			errs <- ""
		}()
	}
	for g := 0; g < 8; g++ {
		if s := <-errs; s != "" {
			t.Errorf("concurrent encode of %q differs", s)
		}
	}
}

// TestLoadAcceptsRealShapes covers JSON shapes the real files use that the
// synthetic ones do not: an empty normalizer Sequence (DeepSeek-V3), a
// post_processor Sequence of ByteLevel + TemplateProcessing, a merge list in
// "a b" form, and a chat_template given as a named list.
func TestLoadAcceptsRealShapes(t *testing.T) {
	var m map[string]any
	json.Unmarshal(buildCase(t, synthCases[0]), &m)
	m["normalizer"] = map[string]any{"type": "Sequence", "normalizers": []any{}}
	m["post_processor"] = map[string]any{"type": "Sequence", "processors": []any{
		map[string]any{"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": false, "use_regex": true},
		map[string]any{"type": "TemplateProcessing",
			"single":         []any{map[string]any{"SpecialToken": map[string]any{"id": "<｜begin▁of▁sentence｜>", "type_id": 0}}, map[string]any{"Sequence": map[string]any{"id": "A", "type_id": 0}}},
			"special_tokens": map[string]any{"<｜begin▁of▁sentence｜>": map[string]any{"id": "<｜begin▁of▁sentence｜>", "ids": []any{1018}, "tokens": []any{"<｜begin▁of▁sentence｜>"}}}},
	}}
	b, _ := json.Marshal(m)
	tc := []byte(`{"chat_template": [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D"}], "bos_token": null}`)
	tk, err := Parse(b, tc, nil)
	if err != nil {
		t.Fatal(err)
	}
	if tk.ChatTemplate() != "D" {
		t.Errorf("chat template %q", tk.ChatTemplate())
	}
	ids, _ := tk.Encode("hi", true)
	if len(ids) == 0 || ids[0] != 1018 {
		t.Errorf("template prefix missing: %v", ids)
	}
	if tk.normalize != nil {
		t.Error("empty normalizer Sequence should be a no-op")
	}
}
