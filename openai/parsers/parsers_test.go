package parsers

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"

	"github.com/tilert-go/tilert/openai"
)

func weatherTools() []openai.Tool {
	return []openai.Tool{
		{Type: "function", Function: openai.Function{Name: "get_weather", Parameters: json.RawMessage(
			`{"type":"object","properties":{"city":{"type":"string"},"days":{"type":"integer"},"opts":{"type":"object"},"code":{"type":"string"}}}`)}},
		{Type: "function", Function: openai.Function{Name: "get_time"}},
	}
}

type call struct{ Name, Args string }

// run feeds text in the given pieces and returns content, the calls as the
// parser holds them, and the calls rebuilt from the streamed deltas.
func run(format, named string, pieces []string) (string, []call, []call) {
	n := 0
	p := NewTools(format, weatherTools(), named, func() string { n++; return fmt.Sprintf("call_%d", n) })
	var content strings.Builder
	var streamed []call
	apply := func(c string, ds []openai.ToolCallDelta) {
		content.WriteString(c)
		for _, d := range ds {
			if d.ID != "" {
				if d.Index != len(streamed) || d.Type != "function" || d.Function.Name == "" || d.Function.Arguments != "" {
					panic(fmt.Sprintf("bad header delta %+v", d))
				}
				streamed = append(streamed, call{Name: d.Function.Name})
				continue
			}
			streamed[d.Index].Args += d.Function.Arguments
		}
	}
	for _, s := range pieces {
		apply(p.Add(s))
	}
	apply(p.Finish())
	var calls []call
	for _, c := range p.Calls() {
		calls = append(calls, call{c.Function.Name, c.Function.Arguments})
	}
	return content.String(), calls, streamed
}

// splits are the ways a text is fed: whole, one byte at a time (bytes of a
// rune included: the decoder only emits whole runes, but the parser must
// not care) and random cuts.
func splits(text string) [][]string {
	out := [][]string{{text}}
	var bytesEach []string
	for i := 0; i < len(text); i++ {
		bytesEach = append(bytesEach, text[i:i+1])
	}
	out = append(out, bytesEach)
	r := rand.New(rand.NewPCG(1, 2))
	for k := 0; k < 20; k++ {
		var ps []string
		for i := 0; i < len(text); {
			j := min(len(text), i+1+r.IntN(12))
			ps = append(ps, text[i:j])
			i = j
		}
		out = append(out, ps)
	}
	return out
}

func TestToolParsers(t *testing.T) {
	for _, tc := range []struct {
		name, format, named, text, content string
		calls                              []call
	}{
		{"glm47 one call", "glm47", "",
			"Let me check.<tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris</arg_value><arg_key>days</arg_key><arg_value>3</arg_value></tool_call>",
			"Let me check.", []call{{"get_weather", `{"city": "Paris", "days": 3}`}}},
		{"glm45 newlines, two calls, no args", "glm45", "",
			"<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>北京</arg_value>\n</tool_call>\n<tool_call>get_time\n</tool_call>",
			"", []call{{"get_weather", `{"city": "北京"}`}, {"get_time", `{}`}}},
		{"glm json values keep order, strings stay strings", "glm47", "",
			`<tool_call>get_weather<arg_key>opts</arg_key><arg_value>{"z":[1,2.5,"a\"b"],"a":null}</arg_value><arg_key>code</arg_key><arg_value>007</arg_value><arg_key>extra</arg_key><arg_value>not json</arg_value></tool_call>`,
			"", []call{{"get_weather", `{"opts": {"z": [1, 2.5, "a\"b"], "a": null}, "code": "007", "extra": "not json"}`}}},
		{"glm text after a call is dropped", "glm47", "",
			"A<tool_call>get_time</tool_call> trailing words", "A", []call{{"get_time", "{}"}}},
		{"glm no call", "glm47", "", "plain <tool text with a < sign", "plain <tool text with a < sign", nil},
		{"glm unfinished start tag is content", "glm47", "", "hello <tool_ca", "hello <tool_ca", nil},
		{"glm unfinished call is closed", "glm47", "",
			"<tool_call>get_weather<arg_key>city</arg_key><arg_value>Par", "", []call{{"get_weather", "{}"}}},
		{"glm named keeps only that function", "glm47", "get_time",
			"<tool_call>get_weather<arg_key>city</arg_key><arg_value>Oslo</arg_value></tool_call><tool_call>get_time</tool_call>",
			"", []call{{"get_time", "{}"}}},
		{"dsml two invokes", "deepseek_v32", "",
			"OK.\n\n<｜DSML｜function_calls>\n<｜DSML｜invoke name=\"get_weather\">\n<｜DSML｜parameter name=\"city\" string=\"true\">杭州</｜DSML｜parameter>\n<｜DSML｜parameter name=\"days\" string=\"false\">2</｜DSML｜parameter>\n</｜DSML｜invoke>\n<｜DSML｜invoke name=\"get_time\">\n</｜DSML｜invoke>\n</｜DSML｜function_calls>",
			"OK.\n\n", []call{{"get_weather", `{"city": "杭州", "days": 2}`}, {"get_time", "{}"}}},
		{"dsml string=true keeps json-looking text a string", "deepseek_v32", "",
			`<｜DSML｜function_calls><｜DSML｜invoke name="get_weather"><｜DSML｜parameter name="opts" string="true">{"a":1}</｜DSML｜parameter><｜DSML｜parameter name="days" string="false">[1, 2]</｜DSML｜parameter></｜DSML｜invoke></｜DSML｜function_calls>`,
			"", []call{{"get_weather", `{"opts": "{\"a\":1}", "days": [1, 2]}`}}},
		{"dsml no call", "deepseek_v32", "", "just <｜DSML｜ text", "just <｜DSML｜ text", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for i, pieces := range splits(tc.text) {
				content, calls, streamed := run(tc.format, tc.named, pieces)
				if content != tc.content || !reflect.DeepEqual(calls, tc.calls) {
					t.Fatalf("split %d: content %q calls %q, want %q %q", i, content, calls, tc.content, tc.calls)
				}
				if !reflect.DeepEqual(streamed, calls) {
					t.Fatalf("split %d: streamed %q != non-streamed %q", i, streamed, calls)
				}
				for _, c := range calls {
					if !json.Valid([]byte(c.Args)) {
						t.Fatalf("arguments %q are not JSON", c.Args)
					}
				}
			}
		})
	}
}

func TestReasoning(t *testing.T) {
	for _, tc := range []struct {
		name, parser string
		thinking     bool
		text         string
		reasoning    string
		content      string
	}{
		{"glm thinking from the prompt", "glm45", true, "let me think</think>The answer.", "let me think", "The answer."},
		{"model opens <think> itself", "glm45", false, "<think>hmm</think>Hi", "hmm", "Hi"},
		{"thinking off", "glm45", false, "no </think> split here", "", "no </think> split here"},
		{"deepseek_v3 thinking", "deepseek_v3", true, "a<b</think>c", "a<b", "c"},
		{"deepseek_r1 always thinks; no end: all reasoning", "deepseek_r1", false, "still thinking </thi", "still thinking </thi", ""},
		{"end tag only at the end", "glm45", true, "x</think>", "x", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for i, pieces := range splits(tc.text) {
				r := NewReasoning(tc.parser, tc.thinking)
				var rs, cs strings.Builder
				for _, p := range pieces {
					a, b := r.Add(p)
					rs.WriteString(a)
					cs.WriteString(b)
				}
				a, b := r.Finish()
				rs.WriteString(a)
				cs.WriteString(b)
				if rs.String() != tc.reasoning || cs.String() != tc.content {
					t.Fatalf("split %d: reasoning %q content %q, want %q %q", i, rs.String(), cs.String(), tc.reasoning, tc.content)
				}
			}
		})
	}
}

func TestParserNames(t *testing.T) {
	for _, n := range append(append([]string{""}, ToolParsers...), ReasoningParsers...) {
		if CheckToolParser(n) != nil && CheckReasoningParser(n) != nil {
			t.Errorf("%q refused by both", n)
		}
	}
	if err := CheckToolParser("hermes"); err == nil {
		t.Error("hermes accepted")
	}
}
