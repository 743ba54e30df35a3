package parsers

import (
	"bytes"
	"encoding/json"
	"regexp"
	"strings"

	"github.com/tilert-go/tilert/openai"
)

// Tools parses tool calls out of content text. Text before the first call
// is content; text between and after calls is dropped (as vLLM's parsers
// do). Each call streams as a header delta (id, type, name, arguments "")
// once its name is complete, then one arguments fragment per complete
// argument, then the closing brace.
type Tools struct {
	dsml  bool
	tools []openai.Tool
	named string // only calls to this function are kept ("" keeps all)
	newID func() string

	buf     string
	state   toolState
	calls   []openai.ToolCall
	cur     *openai.ToolCall // the call being read, nil when skipped or none
	curArgs int              // arguments of cur written so far
	inCall  bool
	anyCall bool // a call block was seen: later text is not content
}

type toolState int

const (
	stText    toolState = iota // content, looking for a call (block) start
	stName                     // glm: after <tool_call>, reading the name
	stArgs                     // glm: reading arguments; dsml: reading parameters
	stBlock                    // dsml: inside function_calls, between invokes
	stBetween                  // after a call or block: looking for the next
)

const (
	glmStart    = "<tool_call>"
	glmEnd      = "</tool_call>"
	glmKey      = "<arg_key>"
	dsmlStart   = "<｜DSML｜function_calls>"
	dsmlEnd     = "</｜DSML｜function_calls>"
	dsmlInvoke  = "<｜DSML｜invoke"
	dsmlInvEnd  = "</｜DSML｜invoke>"
	dsmlParam   = "<｜DSML｜parameter"
	dsmlParEnd  = "</｜DSML｜parameter>"
	glmValueEnd = "</arg_value>"
)

var (
	glmArgRe     = regexp.MustCompile(`^(?s)\s*<arg_key>(.*?)</arg_key>(?:\\n|\s)*<arg_value>(.*?)</arg_value>`)
	dsmlInvokeRe = regexp.MustCompile(`^\s*<｜DSML｜invoke\s+name="([^"]+)"\s*>`)
	dsmlParamRe  = regexp.MustCompile(`^(?s)\s*<｜DSML｜parameter\s+name="([^"]+)"\s+string="(true|false)"\s*>(.*?)</｜DSML｜parameter>`)
)

// NewTools returns a tool-call parser for format name (glm45, glm47 or
// deepseek_v32). tools give the parameter types (a string-typed parameter
// stays a string; others are read as JSON when they parse). named keeps
// only calls to that function. newID makes call ids.
func NewTools(name string, tools []openai.Tool, named string, newID func() string) *Tools {
	return &Tools{dsml: name == "deepseek_v32", tools: tools, named: named, newID: newID}
}

// Calls are the complete and open calls so far (a call still open at the
// end is closed by Finish).
func (t *Tools) Calls() []openai.ToolCall { return t.calls }

// Add consumes content text; it returns the part that is content and the
// tool-call deltas completed by it.
func (t *Tools) Add(piece string) (content string, deltas []openai.ToolCallDelta) {
	t.buf += piece
	var sb strings.Builder
	for {
		progressed, c, d := t.step()
		sb.WriteString(c)
		deltas = append(deltas, d...)
		if !progressed {
			return sb.String(), deltas
		}
	}
}

// Finish ends the text: an open call is closed with what it has, text that
// might have been a tag is content if no call came before it.
func (t *Tools) Finish() (content string, deltas []openai.ToolCallDelta) {
	switch t.state {
	case stText:
		content = t.buf
	case stName:
		if !t.anyCallEmitted() {
			content = t.startTag() + t.buf
		}
	case stArgs, stBlock:
		deltas = t.closeCall()
	}
	t.buf = ""
	return content, deltas
}

func (t *Tools) anyCallEmitted() bool { return len(t.calls) > 0 }

func (t *Tools) startTag() string {
	if t.dsml {
		return dsmlStart
	}
	return glmStart
}

// step consumes one element of t.buf if it is complete.
func (t *Tools) step() (bool, string, []openai.ToolCallDelta) {
	switch t.state {
	case stText, stBetween:
		start := t.startTag()
		if i := strings.Index(t.buf, start); i >= 0 {
			content := ""
			if t.state == stText {
				content = t.buf[:i]
			}
			t.buf = t.buf[i+len(start):]
			t.anyCall = true
			if t.dsml {
				t.state = stBlock
			} else {
				t.state = stName
			}
			return true, content, nil
		}
		keep := partialSuffix(t.buf, start)
		out := t.buf[:len(t.buf)-keep]
		t.buf = t.buf[len(t.buf)-keep:]
		if t.state == stBetween {
			out = ""
		}
		return false, out, nil
	case stName: // glm
		i, j := strings.Index(t.buf, glmKey), strings.Index(t.buf, glmEnd)
		switch {
		case i < 0 && j < 0:
			return false, "", nil
		case i < 0 || (j >= 0 && j < i):
			d := t.openCall(strings.TrimSpace(t.buf[:j]))
			t.buf = t.buf[j:]
			t.state = stArgs
			return true, "", d
		default:
			d := t.openCall(strings.TrimSpace(t.buf[:i]))
			t.buf = t.buf[i:]
			t.state = stArgs
			return true, "", d
		}
	case stArgs:
		if t.dsml {
			return t.stepDSMLParams()
		}
		return t.stepGLMArgs()
	case stBlock: // dsml, between invokes
		s := strings.TrimLeft(t.buf, " \t\r\n")
		if m := dsmlInvokeRe.FindStringSubmatch(s); m != nil {
			t.buf = s[len(m[0]):]
			t.state = stArgs
			return true, "", t.openCall(m[1])
		}
		if strings.HasPrefix(s, dsmlEnd) {
			t.buf = s[len(dsmlEnd):]
			t.state = stBetween
			return true, "", nil
		}
		return t.skipJunk(s, dsmlInvoke, dsmlEnd)
	}
	return false, "", nil
}

func (t *Tools) stepGLMArgs() (bool, string, []openai.ToolCallDelta) {
	s := strings.TrimLeft(t.buf, " \t\r\n")
	if strings.HasPrefix(s, glmEnd) {
		t.buf = s[len(glmEnd):]
		t.state = stBetween
		return true, "", t.closeCall()
	}
	if strings.HasPrefix(s, glmKey) {
		if !strings.Contains(s, glmValueEnd) {
			return false, "", nil
		}
		if m := glmArgRe.FindStringSubmatch(s); m != nil {
			t.buf = s[len(m[0]):]
			return true, "", t.addArg(strings.TrimSpace(m[1]), m[2], false)
		}
		// A malformed pair: drop it up to its </arg_value>.
		t.buf = s[strings.Index(s, glmValueEnd)+len(glmValueEnd):]
		return true, "", nil
	}
	return t.skipJunk(s, glmKey, glmEnd)
}

func (t *Tools) stepDSMLParams() (bool, string, []openai.ToolCallDelta) {
	s := strings.TrimLeft(t.buf, " \t\r\n")
	if strings.HasPrefix(s, dsmlInvEnd) {
		t.buf = s[len(dsmlInvEnd):]
		t.state = stBlock
		return true, "", t.closeCall()
	}
	if strings.HasPrefix(s, dsmlParam) {
		if !strings.Contains(s, dsmlParEnd) {
			return false, "", nil
		}
		if m := dsmlParamRe.FindStringSubmatch(s); m != nil {
			t.buf = s[len(m[0]):]
			return true, "", t.addArg(m[1], m[3], m[2] == "true")
		}
		t.buf = s[strings.Index(s, dsmlParEnd)+len(dsmlParEnd):]
		return true, "", nil
	}
	return t.skipJunk(s, dsmlParam, dsmlInvEnd)
}

// skipJunk drops text that cannot start any expected tag, keeping what may
// still become one.
func (t *Tools) skipJunk(s string, tags ...string) (bool, string, []openai.ToolCallDelta) {
	for _, tag := range tags {
		if strings.HasPrefix(tag, s) || strings.HasPrefix(s, tag) {
			t.buf = s // incomplete (or complete but waiting for more)
			return false, "", nil
		}
	}
	cut := len(s)
	for _, tag := range tags {
		if i := strings.Index(s, tag); i >= 0 && i < cut {
			cut = i
		}
	}
	if cut == len(s) {
		cut = len(s) - maxPartial(s, tags)
	}
	t.buf = s[cut:]
	return cut > 0, "", nil
}

func maxPartial(s string, tags []string) int {
	k := 0
	for _, tag := range tags {
		k = max(k, partialSuffix(s, tag))
	}
	return k
}

func (t *Tools) openCall(name string) []openai.ToolCallDelta {
	t.curArgs = 0
	if t.named != "" && name != t.named {
		t.cur = nil
		t.inCall = true
		return nil
	}
	t.calls = append(t.calls, openai.ToolCall{ID: t.newID(), Type: "function", Function: openai.FunctionCall{Name: name}})
	t.cur = &t.calls[len(t.calls)-1]
	t.inCall = true
	return []openai.ToolCallDelta{{Index: len(t.calls) - 1, ID: t.cur.ID, Type: "function",
		Function: openai.FunctionDelta{Name: name}}}
}

func (t *Tools) frag(s string) []openai.ToolCallDelta {
	if t.cur == nil {
		return nil
	}
	t.cur.Function.Arguments += s
	return []openai.ToolCallDelta{{Index: len(t.calls) - 1, Function: openai.FunctionDelta{Arguments: s}}}
}

func (t *Tools) addArg(key, raw string, forceString bool) []openai.ToolCallDelta {
	if t.cur == nil {
		return nil
	}
	sep := ", "
	if t.curArgs == 0 {
		sep = "{"
	}
	t.curArgs++
	return t.frag(sep + pyString(key) + ": " + t.value(t.cur.Function.Name, key, raw, forceString))
}

func (t *Tools) closeCall() []openai.ToolCallDelta {
	if !t.inCall {
		return nil
	}
	t.inCall = false
	if t.curArgs == 0 {
		return t.frag("{}")
	}
	return t.frag("}")
}

// value renders an argument as JSON: a string when the tool's schema types
// the parameter as string (or the format says so), else the raw text read
// as JSON when it parses, else a string.
func (t *Tools) value(fn, key, raw string, forceString bool) string {
	if !forceString && t.paramType(fn, key) != "string" {
		if v, ok := pyJSON(raw); ok {
			return v
		}
	}
	return pyString(raw)
}

func (t *Tools) paramType(fn, key string) string {
	for _, tool := range t.tools {
		if tool.Function.Name != fn {
			continue
		}
		var schema struct {
			Properties map[string]struct {
				Type json.RawMessage `json:"type"`
			} `json:"properties"`
		}
		if json.Unmarshal(tool.Function.Parameters, &schema) != nil {
			return ""
		}
		p, ok := schema.Properties[key]
		if !ok {
			return ""
		}
		var one string
		if json.Unmarshal(p.Type, &one) == nil {
			return one
		}
		var many []string
		if json.Unmarshal(p.Type, &many) == nil && len(many) == 1 {
			return many[0]
		}
		return ""
	}
	return ""
}

// pyString is s as a JSON string the way Python's json.dumps(...,
// ensure_ascii=False) writes it (vLLM's arguments are made that way).
func pyString(s string) string {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(s)
	return strings.TrimSuffix(b.String(), "\n")
}

// pyJSON re-writes a JSON text with Python's separators (", " and ": "),
// keeping key order and number spelling; ok is false if raw is not JSON.
func pyJSON(raw string) (string, bool) {
	raw = strings.TrimSpace(raw)
	if !json.Valid([]byte(raw)) {
		return "", false
	}
	dec := json.NewDecoder(strings.NewReader(raw))
	dec.UseNumber()
	var sb strings.Builder
	type frame struct {
		obj   bool
		n     int
		isKey bool
	}
	var stack []frame
	for {
		tok, err := dec.Token()
		if err != nil {
			break
		}
		if d, ok := tok.(json.Delim); ok && (d == '}' || d == ']') {
			sb.WriteRune(rune(d))
			stack = stack[:len(stack)-1]
			continue
		}
		if len(stack) > 0 {
			f := &stack[len(stack)-1]
			switch {
			case f.obj && !f.isKey:
				sb.WriteString(": ")
			case f.n > 0:
				sb.WriteString(", ")
			}
		}
		switch v := tok.(type) {
		case json.Delim:
			sb.WriteRune(rune(v))
		case string:
			sb.WriteString(pyString(v))
		case json.Number:
			sb.WriteString(v.String())
		case bool:
			if v {
				sb.WriteString("true")
			} else {
				sb.WriteString("false")
			}
		case nil:
			sb.WriteString("null")
		}
		if len(stack) > 0 {
			f := &stack[len(stack)-1]
			if f.obj && f.isKey {
				f.isKey = false
			} else {
				f.isKey = f.obj
				f.n++
			}
		}
		if d, ok := tok.(json.Delim); ok {
			stack = append(stack, frame{obj: d == '{', isKey: d == '{'})
		}
	}
	return sb.String(), true
}
