package bench

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strings"
	"time"
	"unicode"

	"github.com/ctxd/ctxd"
	"github.com/ctxd/ctxd/client"
	"github.com/ctxd/ctxd/config"
	"github.com/ctxd/ctxd/httpapi"
	"github.com/ctxd/ctxd/modelgen"
)

// QualitySet is one codex of the answer-quality phase and its questions
// (testdata/quality/NAME/questions.json; the codex is NAME/codex).
type QualitySet struct {
	Codex     string            `json:"codex"`
	Kind      string            `json:"kind"`
	Questions []QualityQuestion `json:"questions"`
	dir       string
}

// QualityQuestion is a question with a known short answer: an answer is
// correct when, normalised, it contains one of Answers normalised. Files
// are the codex files the answer is in; two or more: it combines them.
type QualityQuestion struct {
	ID      string   `json:"id"`
	Q       string   `json:"q"`
	Answers []string `json:"answers"`
	Files   []string `json:"files"`
}

// QualityModel is a trained model the phase asks, its window for the
// whole codex (CAG, the naive order and the question alone) and the
// smaller window that makes ctxd retrieve (RAG).
type QualityModel struct {
	Name      string `json:"name"`
	Path      string `json:"path"`
	NumCtx    int    `json:"num_ctx"`
	RAGNumCtx int    `json:"rag_num_ctx"`
}

// The four ways the phase asks each question.
const (
	WayCAG   = "cag"   // ctxd, the codex whole
	WayRAG   = "rag"   // ctxd, the window small enough that it retrieves
	WayNaive = "naive" // the same codex in a naive order: volatile header first, straight to the backend
	WayNone  = "none"  // the question alone, straight to the backend
)

var qualityWays = []string{WayCAG, WayRAG, WayNaive, WayNone}

// QualityRun is the phase's result for one model on one backend.
type QualityRun struct {
	Model        string         `json:"model"`
	Backend      string         `json:"backend"`
	NumCtx       int            `json:"num_ctx"`
	RAGNumCtx    int            `json:"rag_num_ctx"`
	AnswerTokens int            `json:"answer_tokens"`
	Codices      []QualityCodex `json:"codices"`
	Ways         []QualityWay   `json:"ways"`
}

// QualityCodex is one codex as the daemon loaded it.
type QualityCodex struct {
	Name      string `json:"name"`
	Kind      string `json:"kind"`
	Files     int    `json:"files"`
	Bytes     int64  `json:"bytes"`
	Tokens    int64  `json:"tokens"`
	Questions int    `json:"questions"`
	Combined  int    `json:"combined"` // questions whose answer needs two files
	RAGMode   string `json:"rag_mode"` // the plan under the RAG window
}

// QualityWay is how one way did over every question.
type QualityWay struct {
	Way              string          `json:"way"`
	Correct          int             `json:"correct"`
	Asked            int             `json:"asked"`
	Accuracy         float64         `json:"accuracy"`
	Low              float64         `json:"ci95_low"`
	High             float64         `json:"ci95_high"`
	CombinedCorrect  int             `json:"combined_correct"`
	CombinedAsked    int             `json:"combined_asked"`
	ByCodex          map[string]int  `json:"correct_by_codex"`
	TTFTP50          float64         `json:"ttft_p50_ms"`
	TTFTP90          float64         `json:"ttft_p90_ms"`
	EvaluatedP50     float64         `json:"evaluated_p50"`
	EvaluatedMean    float64         `json:"evaluated_mean"`
	PromptTokensMean float64         `json:"prompt_tokens_mean"`
	Answers          []QualityAnswer `json:"answers"`
}

// QualityAnswer is one question's answer, in the order asked.
type QualityAnswer struct {
	ID        string  `json:"id"`
	Answer    string  `json:"answer"`
	Correct   bool    `json:"correct"`
	TTFTMs    float64 `json:"ttft_ms"`
	Evaluated int     `json:"evaluated"`
	Prompt    int     `json:"prompt_tokens"`
}

// LoadQualitySets reads every NAME/questions.json under dir, in name
// order, each checked: ids unique, every question with an answer.
func LoadQualitySets(dir string) ([]QualitySet, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("bench: quality sets: %w", err)
	}
	var sets []QualitySet
	ids := map[string]bool{}
	for _, e := range entries {
		if info, err := os.Stat(filepath.Join(dir, e.Name())); err != nil || !info.IsDir() {
			continue // a file, or a link to none (a set may be a link to a directory)
		}
		p := filepath.Join(dir, e.Name(), "questions.json")
		b, err := os.ReadFile(p)
		if err != nil {
			return nil, fmt.Errorf("bench: quality set %s: %w", e.Name(), err)
		}
		var s QualitySet
		if err := json.Unmarshal(b, &s); err != nil {
			return nil, fmt.Errorf("bench: %s: %w", p, err)
		}
		if s.dir, err = filepath.Abs(filepath.Join(dir, e.Name(), "codex")); err != nil {
			return nil, err
		}
		if st, err := os.Stat(s.dir); err != nil || !st.IsDir() {
			return nil, fmt.Errorf("bench: quality set %s has no codex directory %s", e.Name(), s.dir)
		}
		for _, q := range s.Questions {
			if q.ID == "" || ids[q.ID] || strings.TrimSpace(q.Q) == "" || len(q.Answers) == 0 {
				return nil, fmt.Errorf("bench: %s: question %q: an id used once, a question and an answer are required", p, q.ID)
			}
			ids[q.ID] = true
		}
		sets = append(sets, s)
	}
	if len(sets) == 0 {
		return nil, fmt.Errorf("bench: no quality sets (NAME/questions.json) in %s", dir)
	}
	return sets, nil
}

// normalizeAnswer lowercases s, drops Markdown's emphasis and code marks
// and collapses whitespace, for Graded's contains match.
func normalizeAnswer(s string) string {
	s = strings.ToLower(s)
	s = strings.Map(func(r rune) rune {
		switch {
		case r == '`' || r == '*':
			return -1
		case unicode.IsSpace(r):
			return ' '
		}
		return r
	}, s)
	return strings.Join(strings.Fields(s), " ")
}

// Graded says whether answer contains one of the accepted answers, both
// normalised: deterministic, no model judging a model.
func Graded(answer string, accepted []string) bool {
	a := normalizeAnswer(answer)
	for _, want := range accepted {
		if w := normalizeAnswer(want); w != "" && strings.Contains(a, w) {
			return true
		}
	}
	return false
}

// Wilson is the 95% Wilson score interval of k successes in n trials.
func Wilson(k, n int) (lo, hi float64) {
	if n == 0 {
		return 0, 0
	}
	const z = 1.959964
	p, nf := float64(k)/float64(n), float64(n)
	den := 1 + z*z/nf
	c := (p + z*z/(2*nf)) / den
	h := z * math.Sqrt(p*(1-p)/nf+z*z/(4*nf*nf)) / den
	return max(0, c-h), min(1, c+h)
}

// qualityStack is a daemon over one model on one backend, and a way to
// ask that backend straight.
type qualityStack struct {
	ctxd   *client.Client
	direct func(ctx context.Context, system, user string) (string, float64, int, int, error)
	stop   func()
}

// qualityPhase asks every question of every set four ways, for each model
// on Ollama and (with its binary) on llama-server.
func qualityPhase(ctx context.Context, cfg Config) ([]QualityRun, error) {
	sets, err := LoadQualitySets(cfg.QualityDir)
	if err != nil {
		return nil, err
	}
	backends := []string{"ollama"}
	if cfg.LlamaServerBin != "" {
		backends = append(backends, "llamacpp")
	}
	var runs []QualityRun
	for _, m := range cfg.QualityModels {
		if m.Path, err = filepath.Abs(m.Path); err != nil {
			return nil, err
		}
		if _, err := os.Stat(m.Path); err != nil {
			return nil, fmt.Errorf("bench: quality: the model %s: %w (make models fetches it)", m.Name, err)
		}
		for _, b := range backends {
			run, err := qualityRun(ctx, cfg, sets, m, b)
			if err != nil {
				return nil, fmt.Errorf("bench: quality: %s on %s: %w", m.Name, b, err)
			}
			runs = append(runs, run)
		}
	}
	return runs, nil
}

func qualityRun(ctx context.Context, cfg Config, sets []QualitySet, m QualityModel, backend string) (QualityRun, error) {
	run := QualityRun{Model: m.Name, NumCtx: m.NumCtx, RAGNumCtx: m.RAGNumCtx, AnswerTokens: cfg.QualityAnswerToks}
	answers := map[string][]QualityAnswer{}
	qs := func(s QualitySet) []QualityQuestion {
		if cfg.QualityMax > 0 && len(s.Questions) > cfg.QualityMax {
			return s.Questions[:cfg.QualityMax]
		}
		return s.Questions
	}
	// The whole codex: through ctxd (CAG), then the same codex in a naive
	// order and the question alone, straight to the same backend.
	st, label, err := startQualityStack(ctx, cfg, m, backend, m.NumCtx, sets[0].dir)
	if err != nil {
		return run, err
	}
	run.Backend = label
	for _, s := range sets {
		stats, err := loadQualityCodex(ctx, st.ctxd, s.dir)
		if err != nil {
			st.stop()
			return run, err
		}
		if stats.Plan.Mode != "cag" {
			st.stop()
			return run, fmt.Errorf("the codex %s loads in %s mode in a %d-token window, not whole: a smaller codex, or a bigger window", s.Codex, stats.Plan.Mode, m.NumCtx)
		}
		c := QualityCodex{Name: s.Codex, Kind: s.Kind, Files: stats.Files, Bytes: stats.Bytes, Tokens: stats.Tokens, Questions: len(qs(s))}
		for _, q := range qs(s) {
			if len(q.Files) > 1 {
				c.Combined++
			}
		}
		run.Codices = append(run.Codices, c)
		body, err := naiveCodex(s.dir)
		if err != nil {
			st.stop()
			return run, err
		}
		cfg.Log("quality: %s on %s, %s (%d tokens): %d questions, cag, naive, none", m.Name, label, s.Codex, stats.Tokens, len(qs(s)))
		for _, q := range qs(s) {
			a, err := askQuality(ctx, st.ctxd, "quality-cag-"+q.ID, q)
			if err != nil {
				st.stop()
				return run, fmt.Errorf("cag %s: %w", q.ID, err)
			}
			answers[WayCAG] = append(answers[WayCAG], a)
		}
		for _, way := range []string{WayNaive, WayNone} {
			for _, q := range qs(s) {
				system := ""
				if way == WayNaive {
					system = naiveSystem(body)
				}
				text, ttft, eval, prompt, err := st.direct(ctx, system, q.Q)
				if err != nil {
					st.stop()
					return run, fmt.Errorf("%s %s: %w", way, q.ID, err)
				}
				answers[way] = append(answers[way], QualityAnswer{ID: q.ID, Answer: text, Correct: Graded(text, q.Answers), TTFTMs: ttft, Evaluated: eval, Prompt: prompt})
			}
		}
	}
	st.stop()
	// RAG: the window small enough that ctxd retrieves.
	st, _, err = startQualityStack(ctx, cfg, m, backend, m.RAGNumCtx, sets[0].dir)
	if err != nil {
		return run, err
	}
	defer st.stop()
	for i, s := range sets {
		stats, err := loadQualityCodex(ctx, st.ctxd, s.dir)
		if err != nil {
			return run, err
		}
		run.Codices[i].RAGMode = stats.Plan.Mode
		if stats.Plan.Mode != "rag" {
			return run, fmt.Errorf("the codex %s loads in %s mode in a %d-token window, not rag: a smaller RAG window", s.Codex, stats.Plan.Mode, m.RAGNumCtx)
		}
		cfg.Log("quality: %s on %s, %s: %d questions, rag in a %d-token window", m.Name, label, s.Codex, len(qs(s)), m.RAGNumCtx)
		for _, q := range qs(s) {
			a, err := askQuality(ctx, st.ctxd, "quality-rag-"+q.ID, q)
			if err != nil {
				return run, fmt.Errorf("rag %s: %w", q.ID, err)
			}
			answers[WayRAG] = append(answers[WayRAG], a)
		}
	}
	combined, codexOf := map[string]bool{}, map[string]string{}
	for _, s := range sets {
		for _, q := range qs(s) {
			combined[q.ID] = len(q.Files) > 1
			codexOf[q.ID] = s.Codex
		}
	}
	for _, way := range qualityWays {
		run.Ways = append(run.Ways, summarizeWay(way, answers[way], combined, codexOf))
	}
	return run, nil
}

// summarizeWay scores one way's answers.
func summarizeWay(way string, as []QualityAnswer, combined map[string]bool, codexOf map[string]string) QualityWay {
	w := QualityWay{Way: way, Asked: len(as), Answers: as, ByCodex: map[string]int{}}
	var ttft, eval []float64
	prompt := 0.0
	for _, a := range as {
		if combined[a.ID] {
			w.CombinedAsked++
		}
		if a.Correct {
			w.Correct++
			w.ByCodex[codexOf[a.ID]]++
			if combined[a.ID] {
				w.CombinedCorrect++
			}
		}
		ttft = append(ttft, a.TTFTMs)
		eval = append(eval, float64(a.Evaluated))
		w.EvaluatedMean += float64(a.Evaluated)
		prompt += float64(a.Prompt)
	}
	if w.Asked > 0 {
		w.Accuracy = float64(w.Correct) / float64(w.Asked)
		w.EvaluatedMean /= float64(w.Asked)
		w.PromptTokensMean = prompt / float64(w.Asked)
	}
	w.Low, w.High = Wilson(w.Correct, w.Asked)
	sort.Float64s(ttft)
	sort.Float64s(eval)
	w.TTFTP50, w.TTFTP90 = percentile(ttft, 0.5), percentile(ttft, 0.9)
	w.EvaluatedP50 = percentile(eval, 0.5)
	return w
}

// askQuality asks q through ctxd in a session of its own.
func askQuality(ctx context.Context, c *client.Client, session string, q QualityQuestion) (QualityAnswer, error) {
	a, _, err := askWithSummary(ctx, c, session, q)
	return a, err
}

// loadQualityCodex loads dir as the daemon's codex and waits for its exact
// token count.
func loadQualityCodex(ctx context.Context, c *client.Client, dir string) (*ctxd.CodexStats, error) {
	stats, err := c.LoadCodex(ctx, dir, nil)
	if err != nil {
		return nil, err
	}
	for deadline := time.Now().Add(time.Minute); !stats.TokensExact && time.Now().Before(deadline); {
		time.Sleep(200 * time.Millisecond)
		if err := c.GetJSON(ctx, "/v1/codex", stats); err != nil {
			return nil, err
		}
	}
	return stats, nil
}

// naiveCodex is the codex's files, each under its path, in path order.
func naiveCodex(dir string) (string, error) {
	var sb strings.Builder
	err := filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		fmt.Fprintf(&sb, "File: %s\n%s\n", rel, b)
		return nil
	})
	return sb.String(), err
}

// naiveSystem is the system message of the naive order: what changes with
// every request first (the time, the machine's raw numbers), then the
// codex — so nothing of it can be reused from the cache.
func naiveSystem(codex string) string {
	return fmt.Sprintf("Current time: %s\nGoroutines: %d\n\nYou answer questions about the codebase below.\n\nCodebase:\n%s",
		time.Now().Format(time.RFC3339Nano), runtime.NumGoroutine(), codex)
}

// startQualityStack starts a daemon over model m on backend with window
// numCtx and the codex dir, its answers cfg.QualityAnswerToks long, and a
// direct line to the same backend and model load.
func startQualityStack(ctx context.Context, cfg Config, m QualityModel, backend string, numCtx int, dir string) (*qualityStack, string, error) {
	if backend == "llamacpp" {
		work, err := os.MkdirTemp("", "ctxd-quality-")
		if err != nil {
			return nil, "", err
		}
		c := cfg
		c.AnswerToks, c.CAGRatio = cfg.QualityAnswerToks, 0
		ls, err := startLlamaStack(ctx, c, m.Path, dir, work, numCtx, 1)
		if err != nil {
			os.RemoveAll(work)
			return nil, "", err
		}
		var status httpapi.Status
		if err := ls.ctxd.GetJSON(ctx, "/v1/status", &status); err != nil {
			ls.stop()
			os.RemoveAll(work)
			return nil, "", err
		}
		key, base := ls.key, status.Backend.URL
		direct := func(ctx context.Context, system, user string) (string, float64, int, int, error) {
			return llamaChat(ctx, base, key, system, user, cfg.QualityAnswerToks)
		}
		return &qualityStack{ctxd: ls.ctxd, direct: direct, stop: func() { ls.stop(); os.RemoveAll(work) }},
			"llama-server", nil
	}
	// The harness's Ollama stack, on the trained model's file (a config
	// with only its name), the daemon over dir.
	st, err := startStackWith(ctx, cfg, modelgen.Config{Name: m.Name}, m.Path, numCtx, 1, func(dc *config.Config) {
		dc.Limits.AnswerReserve, dc.Codex.Path = cfg.QualityAnswerToks, dir
	})
	if err != nil {
		return nil, "", err
	}
	version, err := ollamaVersion(ctx, cfg, st)
	if err != nil {
		st.stop()
		return nil, "", err
	}
	base := st.srv.URL().String()
	direct := func(ctx context.Context, system, user string) (string, float64, int, int, error) {
		return ollamaChat(ctx, base, m.Name, numCtx, system, user, cfg.QualityAnswerToks)
	}
	return &qualityStack{ctxd: st.ctxd, direct: direct, stop: st.stop}, "Ollama " + version, nil
}

// chatMessages are system (when not empty) and user as chat messages.
func chatMessages(system, user string) []map[string]string {
	var msgs []map[string]string
	if system != "" {
		msgs = append(msgs, map[string]string{"role": "system", "content": system})
	}
	return append(msgs, map[string]string{"role": "user", "content": user})
}

// ollamaChat asks Ollama's /api/chat (the model's own template) and
// returns the answer, the time to its first piece, the prompt tokens
// Ollama evaluated and the prompt's length as Ollama reports them.
func ollamaChat(ctx context.Context, base, model string, numCtx int, system, user string, answerToks int) (string, float64, int, int, error) {
	body, _ := json.Marshal(map[string]any{
		"model": model, "messages": chatMessages(system, user), "stream": true, "keep_alive": -1,
		"options": map[string]any{"num_ctx": numCtx, "num_batch": 512, "num_predict": answerToks, "temperature": 0},
	})
	var text strings.Builder
	var ttft float64
	evaluated := 0
	err := streamLines(ctx, base+"/api/chat", "", body, func(start time.Time, line []byte) error {
		var c struct {
			Message         struct{ Content string } `json:"message"`
			Done            bool                     `json:"done"`
			PromptEvalCount int                      `json:"prompt_eval_count"`
			Error           string                   `json:"error"`
		}
		if err := json.Unmarshal(line, &c); err != nil {
			return err
		}
		if c.Error != "" {
			return fmt.Errorf("ollama: %s", c.Error)
		}
		if c.Message.Content != "" && ttft == 0 {
			ttft = ms(time.Since(start))
		}
		text.WriteString(c.Message.Content)
		if c.Done {
			evaluated = c.PromptEvalCount
		}
		return nil
	})
	return text.String(), ttft, evaluated, evaluated, err
}

// Ollama's prompt_eval_count, above, is the whole prompt, cached or not:
// the table says Ollama does not report what it evaluated.

// llamaChat asks llama-server's /v1/chat/completions (the model's own
// template, as llama-server renders it) with its API key.
func llamaChat(ctx context.Context, base, key, system, user string, answerToks int) (string, float64, int, int, error) {
	body, _ := json.Marshal(map[string]any{
		"messages": chatMessages(system, user), "stream": true, "max_tokens": answerToks, "temperature": 0, "cache_prompt": true,
	})
	var text strings.Builder
	var ttft float64
	evaluated, prompt := 0, 0
	err := streamLines(ctx, strings.TrimSuffix(base, "/")+"/v1/chat/completions", key, body, func(start time.Time, line []byte) error {
		data, ok := bytes.CutPrefix(line, []byte("data: "))
		if !ok || string(data) == "[DONE]" {
			return nil
		}
		var c struct {
			Choices []struct {
				Delta struct{ Content string } `json:"delta"`
			} `json:"choices"`
			Timings *struct {
				CacheN  int `json:"cache_n"`
				PromptN int `json:"prompt_n"`
			} `json:"timings"`
		}
		if err := json.Unmarshal(data, &c); err != nil {
			return err
		}
		for _, ch := range c.Choices {
			if ch.Delta.Content != "" && ttft == 0 {
				ttft = ms(time.Since(start))
			}
			text.WriteString(ch.Delta.Content)
		}
		if c.Timings != nil {
			evaluated, prompt = c.Timings.PromptN, c.Timings.PromptN+c.Timings.CacheN
		}
		return nil
	})
	return text.String(), ttft, evaluated, prompt, err
}

// directHTTP opens a connection per request: a server that closes an idle
// keep-alive connection (llama-server's after a few seconds) while the
// harness asks through ctxd would fail the next POST with EOF.
var directHTTP = &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}

// streamLines posts body to url and calls fn with each non-empty line of
// the streamed answer and the time the request was sent.
//
// url may begin with the path of a Unix socket ending in .sock (a managed
// llama-server's default address): the request goes over the socket.
func streamLines(ctx context.Context, url, key string, body []byte, fn func(start time.Time, line []byte) error) error {
	hc := directHTTP
	if sock, path, ok := strings.Cut(url, ".sock/"); ok && !strings.Contains(sock, "://") {
		sock += ".sock"
		hc = &http.Client{Transport: &http.Transport{DisableKeepAlives: true,
			DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
				return (&net.Dialer{}).DialContext(ctx, "unix", sock)
			}}}
		url = "http://unix/" + path
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	start := time.Now()
	resp, err := hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		return fmt.Errorf("%s: %s: %s", url, resp.Status, bytes.TrimSpace(b))
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 0, 64<<10), 16<<20)
	for sc.Scan() {
		if line := bytes.TrimSpace(sc.Bytes()); len(line) > 0 {
			if err := fn(start, line); err != nil {
				return err
			}
		}
	}
	return sc.Err()
}

// reportsReuse says whether the backend reports the prompt tokens it
// evaluated beside those it reused: llama-server does, Ollama does not.
func reportsReuse(backend string) bool { return !strings.HasPrefix(backend, "Ollama") }

// qualityWayNames are the ways as the table names them.
var qualityWayNames = map[string]string{
	WayCAG: "ctxd, CAG (codex whole)", WayRAG: "ctxd, RAG (small window)",
	WayNaive: "same codex, naive order", WayNone: "question alone",
}

// qualityMarkdown writes the answer-quality section.
func (r *Report) qualityMarkdown(b *strings.Builder) {
	if len(r.Quality) == 0 {
		return
	}
	q0 := r.Quality[0]
	fmt.Fprintf(b, "### Answer quality\n\nMeasured %s (`make bench-quality`). ", r.ranAt(PhaseQuality))
	var codices []string
	total, combined := 0, 0
	for _, c := range q0.Codices {
		codices = append(codices, fmt.Sprintf("`%s` (%s; %d files, %s tokens, %d questions, %d of them combining two files)", c.Name, c.Kind, c.Files, thousands(int(c.Tokens)), c.Questions, c.Combined))
		total += c.Questions
		combined += c.Combined
	}
	fmt.Fprintf(b, "%d questions with known short answers over three fictional codices written for this benchmark, so that no model knows them beforehand ([testdata/quality](../testdata/quality)): %s. Each question is asked in a session of its own, four ways: **%s** — ctxd with the codex whole in a %d-token window; **%s** — ctxd with the window cut to %d tokens, so that it retrieves (a map and a working set of excerpts); **%s** — the same codex straight to the backend, after a header that changes with every request (the time), in the model's own chat template; **%s** — the question straight to the backend, nothing else. Answers are at most %d tokens, greedy; an answer is correct when, lowercased with whitespace collapsed, it contains an accepted answer (no model judges a model). Accuracy with its 95%% Wilson interval; time to first token is the client's, medians and 90th percentiles over all questions; evaluated is the prompt tokens the backend evaluated (not cached).\n\n",
		total, strings.Join(codices, "; "), qualityWayNames[WayCAG], q0.NumCtx, qualityWayNames[WayRAG], q0.RAGNumCtx,
		qualityWayNames[WayNaive], qualityWayNames[WayNone], q0.AnswerTokens)
	fmt.Fprintf(b, "| model | backend | way | correct | accuracy (95%% CI) | two-file questions | by codex | TTFT p50 / p90 | prompt tokens, mean | evaluated p50 (mean) |\n|---|---|---|---|---|---|---|---|---|---|\n")
	for _, run := range r.Quality {
		for _, w := range run.Ways {
			var by []string
			for _, c := range run.Codices {
				by = append(by, fmt.Sprintf("%s %d", c.Name, w.ByCodex[c.Name]))
			}
			prompt, eval := thousands(int(math.Round(w.PromptTokensMean))), "not reported"
			if reportsReuse(run.Backend) {
				eval = fmt.Sprintf("%s (%s)", thousands(int(w.EvaluatedP50)), thousands(int(math.Round(w.EvaluatedMean))))
			}
			fmt.Fprintf(b, "| %s | %s | %s | %d / %d | %.0f%% (%.0f–%.0f%%) | %d / %d | %s | %s / %s | %s | %s |\n",
				run.Model, run.Backend, qualityWayNames[w.Way], w.Correct, w.Asked, 100*w.Accuracy, 100*w.Low, 100*w.High,
				w.CombinedCorrect, w.CombinedAsked, strings.Join(by, ", "), msLabel(w.TTFTP50), msLabel(w.TTFTP90), prompt, eval)
		}
	}
	b.WriteString("\nOllama does not report what it reused (its `prompt_eval_count` is the whole prompt), so only llama-server's rows (`prompt_n`, what it evaluated beside `cache_n`) say how much each way evaluated; on Ollama the time to first token shows it.\n")
	b.WriteString("\n")
	b.WriteString(r.qualityVerdict())
	b.WriteString("\n")
}

// qualityVerdict says, per run, whether ctxd's ways beat the question
// alone outside the intervals, as the numbers say.
func (r *Report) qualityVerdict() string {
	var out []string
	for _, run := range r.Quality {
		way := map[string]QualityWay{}
		for _, w := range run.Ways {
			way[w.Way] = w
		}
		none := way[WayNone]
		for _, k := range []string{WayCAG, WayRAG} {
			w := way[k]
			switch {
			case w.Low > none.High:
				out = append(out, fmt.Sprintf("%s on %s: %s beats the question alone outside the intervals (%.0f%% against %.0f%%).", run.Model, run.Backend, qualityWayNames[k], 100*w.Accuracy, 100*none.Accuracy))
			default:
				out = append(out, fmt.Sprintf("%s on %s: %s does **not** beat the question alone outside the intervals (%.0f%% against %.0f%%).", run.Model, run.Backend, qualityWayNames[k], 100*w.Accuracy, 100*none.Accuracy))
			}
		}
		if n, c := way[WayNaive], way[WayCAG]; n.Asked > 0 && c.TTFTP50 > 0 {
			out = append(out, fmt.Sprintf("%s on %s: the naive order's median time to first token is %.1f× ctxd CAG's (%s against %s), for the same content.", run.Model, run.Backend, n.TTFTP50/c.TTFTP50, msLabel(n.TTFTP50), msLabel(c.TTFTP50)))
		}
	}
	if len(out) == 0 {
		return ""
	}
	return "- " + strings.Join(slices.Compact(out), "\n- ") + "\n"
}
