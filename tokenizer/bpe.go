package tokenizer

import (
	"container/heap"
	"sync"
)

type mergeVal struct {
	rank  int32
	newID int32
}

func pairKey(a, b int32) uint64 { return uint64(uint32(a))<<32 | uint64(uint32(b)) }

// bpeModel runs byte-level BPE on raw bytes: the initial symbols are the
// tokens of single bytes, so no byte-level string is ever built.
type bpeModel struct {
	byteID       [256]int32 // -1 when the byte has no token (HF then drops it)
	merges       map[uint64]mergeVal
	ignoreMerges bool
	byteVocab    map[string]int32 // raw bytes of byte-level vocab entries (ignore_merges)

	mu    sync.RWMutex
	cache map[string][]int32
}

const bpeCacheMax = 1 << 16

type symbol struct {
	id         int32
	prev, next int32
	gone       bool
}

type mergeItem struct {
	pos   int32
	rank  int32
	newID int32
}

type mergeHeap []mergeItem

func (h mergeHeap) Len() int { return len(h) }
func (h mergeHeap) Less(i, j int) bool {
	if h[i].rank != h[j].rank {
		return h[i].rank < h[j].rank
	}
	return h[i].pos < h[j].pos
}
func (h mergeHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *mergeHeap) Push(x any)   { *h = append(*h, x.(mergeItem)) }
func (h *mergeHeap) Pop() any     { old := *h; x := old[len(old)-1]; *h = old[:len(old)-1]; return x }

// encodeWord appends the ids of one pre-token.
func (m *bpeModel) encodeWord(dst []int, word string) []int {
	m.mu.RLock()
	ids, ok := m.cache[word]
	m.mu.RUnlock()
	if ok {
		for _, id := range ids {
			dst = append(dst, int(id))
		}
		return dst
	}
	ids = m.merge(word)
	m.mu.Lock()
	if len(m.cache) >= bpeCacheMax {
		clear(m.cache) // a crude bound; words repeat heavily so this is rare
	}
	m.cache[word] = ids
	m.mu.Unlock()
	for _, id := range ids {
		dst = append(dst, int(id))
	}
	return dst
}

// merge follows HF's Word::merge_all: a priority queue ordered by (rank,
// position); a popped entry is applied only if the pair at that position
// still produces the same new token.
func (m *bpeModel) merge(word string) []int32 {
	if m.ignoreMerges {
		if id, ok := m.byteVocab[word]; ok {
			return []int32{id}
		}
	}
	syms := make([]symbol, 0, len(word))
	for i := 0; i < len(word); i++ {
		id := m.byteID[word[i]]
		if id < 0 {
			continue
		}
		syms = append(syms, symbol{id: id, prev: int32(len(syms)) - 1, next: int32(len(syms)) + 1})
	}
	if len(syms) == 0 {
		return nil
	}
	syms[len(syms)-1].next = -1
	h := make(mergeHeap, 0, len(syms))
	for i := 0; i+1 < len(syms); i++ {
		if mv, ok := m.merges[pairKey(syms[i].id, syms[i+1].id)]; ok {
			h = append(h, mergeItem{pos: int32(i), rank: mv.rank, newID: mv.newID})
		}
	}
	heap.Init(&h)
	for h.Len() > 0 {
		top := heap.Pop(&h).(mergeItem)
		cur := &syms[top.pos]
		if cur.gone || cur.next < 0 {
			continue
		}
		right := syms[cur.next]
		if mv, ok := m.merges[pairKey(cur.id, right.id)]; !ok || mv.newID != top.newID {
			continue
		}
		cur.id = top.newID
		syms[cur.next].gone = true
		cur.next = right.next
		if right.next >= 0 {
			syms[right.next].prev = top.pos
		}
		if cur.prev >= 0 {
			if mv, ok := m.merges[pairKey(syms[cur.prev].id, cur.id)]; ok {
				heap.Push(&h, mergeItem{pos: cur.prev, rank: mv.rank, newID: mv.newID})
			}
		}
		if cur.next >= 0 {
			if mv, ok := m.merges[pairKey(cur.id, syms[cur.next].id)]; ok {
				heap.Push(&h, mergeItem{pos: top.pos, rank: mv.rank, newID: mv.newID})
			}
		}
	}
	out := make([]int32, 0, len(syms))
	for i := 0; i >= 0; i = int(syms[i].next) {
		out = append(out, syms[i].id)
	}
	return out
}
