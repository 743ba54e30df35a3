package router

import (
	"encoding/json"
	"testing"

	"github.com/tilert-go/tilert/openai"
)

// The choices' answer: every choice by index, with the usage given.
func TestMergeJSON(t *testing.T) {
	for _, chat := range []bool{false, true} {
		var ems []*jsonEmitter
		for i := range 3 {
			e := &jsonEmitter{base: base{index: i, chat: chat}}
			e.finish("length", openai.NewUsage(19, 8+i), nil)
			ems = append(ems, e)
		}
		var a struct {
			Choices []struct {
				Index int `json:"index"`
			} `json:"choices"`
			Usage openai.Usage `json:"usage"`
		}
		if err := json.Unmarshal(mergeJSON(ems, openai.NewUsage(19, 27)), &a); err != nil {
			t.Fatal(err)
		}
		if len(a.Choices) != 3 || a.Choices[2].Index != 2 || a.Usage != openai.NewUsage(19, 27) {
			t.Errorf("chat=%v: %+v", chat, a)
		}
	}
}
