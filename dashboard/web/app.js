// ctxd live dashboard. One ES module, no build step; uPlot is the only library.
// Data arrives as server-sent events from ../v1/dashboard/events (relative, so a
// /t/TOKEN/ prefix is kept); see the event names in connect().
import uPlot from './vendor/uPlot.esm.js';

const MAX_TURNS = 40;      // per session, in the DOM and in memory
const MAX_SESSIONS = 50;
const MAX_BUCKETS = 60;
const MAX_BANDS = 30;
const MAX_MOVES = 10;
const MAX_BREAKS = 40;     // per session
const CHART_MIN_H = 220;
const CHART_MAX_H = 460;
/** The chart fills its box (which grows with the grid row on wide screens). */
function chartHeight() {
  const hgt = $('#activity-chart').clientHeight;
  return Math.max(CHART_MIN_H, Math.min(CHART_MAX_H, hgt || CHART_MIN_H));
}

// ---------- small helpers ----------

const $ = (sel) => document.querySelector(sel);
const nf = new Intl.NumberFormat('en-US');
const isNum = (v) => typeof v === 'number' && Number.isFinite(v);

/** Integer with thousands separators, or an em dash when missing. */
function num(v) {
  return isNum(v) ? nf.format(Math.round(v)) : '—';
}

/** Milliseconds, truncated: 480.66 → "480", 0.537 → "0.5", 0.006 → "0". */
function ms(v) {
  if (!isNum(v)) return '—';
  if (Math.abs(v) >= 10) return nf.format(Math.trunc(v));
  const t = Math.trunc(v * 10) / 10;
  return String(t === 0 ? 0 : t);
}

/** A duration in ms as text: "480 ms", "9.9 s", "2 min". */
function dur(v) {
  if (!isNum(v)) return '—';
  if (v < 1000) return ms(v) + ' ms';
  if (v < 60000) return (Math.round(v / 100) / 10) + ' s';
  return (Math.round(v / 6000) / 10) + ' min';
}

/** Bytes in binary units: 94371840 → "90 MiB". */
function bytes(v) {
  if (!isNum(v)) return '—';
  const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  let x = Math.abs(v), i = 0;
  while (x >= 1024 && i < units.length - 1) { x /= 1024; i++; }
  const s = x >= 100 || i === 0 ? Math.round(x) : Math.round(x * 10) / 10;
  return (v < 0 ? '-' : '') + s + ' ' + units[i];
}

/** Compact count for axes: 7400 → "7.4k". */
function compact(v) {
  if (!isNum(v)) return '';
  const a = Math.abs(v);
  if (a >= 1e6) return (Math.round(v / 1e5) / 10) + 'M';
  if (a >= 1e3) return (Math.round(v / 1e2) / 10) + 'k';
  return String(Math.round(v * 10) / 10);
}

const pad2 = (n) => String(n).padStart(2, '0');
function clock(d) {
  return pad2(d.getHours()) + ':' + pad2(d.getMinutes()) + ':' + pad2(d.getSeconds());
}
/** An RFC 3339 time as local HH:MM:SS; the input when it does not parse. */
function timeOf(iso) {
  if (!iso) return '';
  const d = new Date(iso);
  return Number.isNaN(d.getTime()) ? String(iso) : clock(d);
}
function unixOf(iso) {
  const t = Date.parse(iso);
  return Number.isNaN(t) ? NaN : t / 1000;
}

/** Any JSON value as short text (strings as they are, lists joined). */
function text(v) {
  if (v == null) return '';
  if (Array.isArray(v)) return v.map(text).join(', ');
  if (typeof v === 'number') return num(v);
  if (typeof v === 'object') {
    if (typeof v.path === 'string') return v.path;
    return Object.entries(v).map(([k, x]) => k + ' ' + text(x)).join(', ');
  }
  return String(v);
}

/** createElement with attributes and children; never parses HTML. */
function h(tag, attrs, ...kids) {
  const el = document.createElement(tag);
  if (attrs) {
    for (const [k, v] of Object.entries(attrs)) {
      if (v == null || v === false) continue;
      if (k === 'class') el.className = v;
      else el.setAttribute(k, v === true ? '' : String(v));
    }
  }
  for (const k of kids.flat(Infinity)) {
    if (k == null || k === false || k === '') continue;
    el.append(k instanceof Node ? k : String(k));
  }
  return el;
}

/** A <dl> of small labelled numbers. Pairs with an empty value are left out. */
function stats(pairs, cls = 'stats') {
  const dl = h('dl', { class: cls });
  for (const [label, value, note] of pairs) {
    if (value == null || value === '' || value === '—') continue;
    dl.append(h('div', null, h('dt', null, label), h('dd', null, value, note ? h('span', { class: 'unit' }, ' ' + note) : null)));
  }
  return dl;
}

/** A table in its own horizontally scrolling box. */
function table(caption, head, rows, numericCols = []) {
  const t = h('table', null,
    h('caption', { class: 'sr-only' }, caption),
    h('thead', null, h('tr', null, head.map((c, i) => h('th', { scope: 'col', class: numericCols.includes(i) ? 'num' : null }, c)))),
    h('tbody', null, rows.map((r) => h('tr', null, r.map((c, i) => h('td', { class: numericCols.includes(i) ? 'num' : null }, c))))));
  return h('div', { class: 'table-wrap', role: 'region', 'aria-label': caption, tabindex: '0' }, t);
}

// ---------- state ----------

const state = {
  viewer: null,
  version: '',
  bucketS: 10,
  status: null,
  karma: undefined,
  bands: [],
  series: [],          // [{start, requests, evaluated, reused}], contiguous, oldest first
  clockOffset: 0,      // server seconds minus browser seconds, estimated
  workingSet: null,    // {sigil, session, turn, ws} of the latest RAG turn
  moves: [],           // newest last: {sigil, session, turn, text}
  everLive: false,
};
const sessions = new Map();  // "sigil\0session" → session record
let sessionCounter = 0;
let activityCounter = 0;

const sessionList = () => $('#session-list');

// ---------- turns and sessions ----------

/** Tokens reused from the server's cache: what the server says it reused where it says (llama-server), else what ctxd expected it to hold (as the daemon's series counts them). */
function cachedOf(s) {
  return isNum(s.backend_cached_tokens) ? s.backend_cached_tokens : (isNum(s.cached_tokens) ? s.cached_tokens : 0);
}
function evaluatedOf(s) {
  return isNum(s.evaluated_tokens) ? s.evaluated_tokens : 0;
}
function promptOf(s) {
  const p = isNum(s.prompt_tokens) ? s.prompt_tokens : 0;
  return Math.max(p, cachedOf(s) + evaluatedOf(s));
}

function timingText(s) {
  const t = s.timing || {};
  const parts = [];
  if (isNum(t.queue_wait_ms)) parts.push('queue ' + ms(t.queue_wait_ms));
  if (isNum(t.governor_ms)) parts.push('governor ' + ms(t.governor_ms));
  if (isNum(t.condense_ms)) parts.push('condense ' + ms(t.condense_ms));
  if (isNum(t.restore_ms)) parts.push('restore ' + ms(t.restore_ms));
  if (isNum(t.backend_ttft_ms)) parts.push('backend ' + ms(t.backend_ttft_ms));
  if (isNum(t.other_ms) && t.other_ms >= 1) parts.push('other ' + ms(t.other_ms));
  let out = 'first token ' + ms(s.ttft_ms) + ' ms';
  if (parts.length) out += ' (' + parts.join(', ') + ')';
  return out;
}

function breakText(b) {
  const block = b && b.block ? 'at the ' + b.block + ' block' : '';
  const reason = b && b.reason ? b.reason : '';
  return 'prefix broke' + (block ? ' ' + block : '') + (reason ? ': ' + reason : '');
}

function sessionKey(sigil, session) {
  return String(sigil ?? '') + '\u0000' + String(session ?? '');
}

function newSession(sigil, session) {
  const id = 'sess-' + (++sessionCounter);
  const rec = {
    key: sessionKey(sigil, session), sigil: String(sigil ?? ''), session: String(session ?? ''),
    persona: '', id, turns: [], breaks: [], maxPrompt: 0, lastActive: 0, expanded: true,
  };
  rec.button = h('button', { type: 'button', class: 'session-toggle', 'aria-expanded': 'true', 'aria-controls': id + '-turns' });
  rec.meta = h('p', { class: 'session-meta' });
  rec.turnsEl = h('div', { class: 'turns', id: id + '-turns' });
  rec.breaksList = h('ul', { class: 'break-list' });
  rec.breaksEl = h('div', { class: 'breaks', hidden: true },
    h('h4', null, 'Prefix breaks in this session'), rec.breaksList);
  rec.el = h('article', { class: 'session', 'data-sigil': rec.sigil, 'data-session': rec.session, 'aria-labelledby': id + '-h' },
    h('div', { class: 'session-head' }, h('h3', { id: id + '-h' }, rec.button), rec.meta),
    rec.turnsEl, rec.breaksEl);
  rec.button.addEventListener('click', () => {
    rec.expanded = !rec.expanded;
    rec.button.setAttribute('aria-expanded', String(rec.expanded));
    rec.turnsEl.hidden = !rec.expanded;
  });
  renderSessionHead(rec);
  return rec;
}

function renderSessionHead(rec) {
  rec.button.replaceChildren(
    h('span', { class: 'chev', 'aria-hidden': 'true' }),
    h('span', { class: 'sid' }, rec.session || '(no id)'), ' ',
    h('span', { class: 'who' }, 'sigil ' + rec.sigil + (rec.persona ? ' · persona ' + rec.persona : '')));
  let cached = 0, evaluated = 0;
  for (const t of rec.turns) { cached += t.cached; evaluated += t.evaluated; }
  const n = rec.turns.length;
  const parts = [n + (n === 1 ? ' turn' : ' turns'), num(cached) + ' cached', num(evaluated) + ' evaluated'];
  if (cached + evaluated > 0) parts.push(Math.floor(100 * cached / (cached + evaluated)) + '% reused');
  if (rec.breaks.length) parts.push(rec.breaks.length + (rec.breaks.length === 1 ? ' break' : ' breaks'));
  rec.meta.textContent = parts.join(' · ');
}

function sizeBar(t, maxPrompt) {
  const w = maxPrompt > 0 ? Math.max(0.5, 100 * t.prompt / maxPrompt) : 0;
  t.bar.style.width = w + '%';
}

function buildTurnRow(t) {
  const s = t.summary;
  const reuse = isNum(s.reuse_percent) ? Math.floor(s.reuse_percent) + '%'
    : (t.prompt > 0 ? Math.floor(100 * t.cached / t.prompt) + '%' : '—');
  const line = 'turn ' + t.turn + ' · ' + num(t.cached) + ' cached · ' + num(t.evaluated) + ' evaluated · ' + reuse + ' · ' + timingText(s);

  const segTotal = Math.max(1, t.cached + t.evaluated);
  const cachedSeg = h('span', { class: 'seg seg-cached' });
  const evalSeg = h('span', { class: 'seg seg-evaluated' });
  cachedSeg.style.flexGrow = String(t.cached / segTotal);
  evalSeg.style.flexGrow = String(t.evaluated / segTotal);
  if (t.evaluated > 0) evalSeg.classList.add('nonzero');
  if (t.cached > 0) cachedSeg.classList.add('nonzero');
  t.bar = h('div', {
    class: 'bar', role: 'img',
    'aria-label': 'turn ' + t.turn + ': ' + num(t.cached) + ' tokens cached, ' + num(t.evaluated) + ' evaluated, of '
      + num(s.prompt_tokens ?? t.prompt) + ' prompt tokens (' + reuse + ' reused)',
  }, cachedSeg, evalSeg);

  const sub = [];
  if (s.mode) sub.push(String(s.mode).toUpperCase());
  if (isNum(s.slot)) sub.push('slot ' + s.slot);
  if (isNum(s.answer_tokens)) sub.push(num(s.answer_tokens) + ' answer tokens');
  if (isNum(s.total_ms)) sub.push('total ' + dur(s.total_ms));
  if (s.done_reason) sub.push('ended: ' + s.done_reason);
  if (Array.isArray(s.governor) && s.governor.length) sub.push('governor: ' + s.governor.map((g) => g.kind || 'action').join(', '));
  if (t.at) sub.push(timeOf(t.at));

  const detailsId = 'td-' + (++activityCounter);
  const detailsBtn = h('button', { type: 'button', class: 'link-btn', 'aria-expanded': 'false', 'aria-controls': detailsId }, 'details');
  const details = h('div', { class: 'turn-details', id: detailsId, hidden: true });
  detailsBtn.addEventListener('click', () => {
    const open = detailsBtn.getAttribute('aria-expanded') !== 'true';
    if (open && !details.firstChild) details.append(...turnDetails(t));
    detailsBtn.setAttribute('aria-expanded', String(open));
    details.hidden = !open;
  });

  const textCol = h('div', { class: 'turn-text' },
    h('p', { class: 'turn-line' }, line),
    s.prefix_break ? h('p', { class: 'turn-break' }, h('span', { class: 'tag tag-warn' }, '⚠ break'), ' ', breakText(s.prefix_break)) : null,
    h('p', { class: 'turn-sub' }, sub.join(' · '), sub.length ? ' · ' : '', detailsBtn),
    details);

  t.el = h('div', {
    class: 'turn' + (s.prefix_break ? ' has-break' : ''),
    'data-turn': t.turn, 'data-cached': t.cached, 'data-evaluated': t.evaluated,
  }, h('div', { class: 'track' }, t.bar), textCol);
}

function turnDetails(t) {
  const s = t.summary;
  const out = [];
  const notes = [];
  if (s.prefix_note) notes.push(['prefix', s.prefix_note]);
  if (s.slot_note) notes.push(['slot', s.slot_note]);
  if (s.reuse_note) notes.push(['reuse', s.reuse_note]);
  if (isNum(s.backend_cached_tokens) && isNum(s.cached_tokens) && s.backend_cached_tokens !== s.cached_tokens) {
    notes.push(['expected', 'ctxd expected ' + num(s.cached_tokens) + ' cached tokens; the server measured ' + num(s.backend_cached_tokens)]);
  }
  if (s.karma && s.karma.began) notes.push(['karma', s.karma.began]);
  if (notes.length) out.push(h('dl', { class: 'notes' }, notes.map(([k, v]) => h('div', null, h('dt', null, k), h('dd', null, v)))));

  const tm = s.timing || {};
  out.push(h('p', null, 'Time to first token ' + ms(s.ttft_ms) + ' ms: queue ' + ms(tm.queue_wait_ms) + ', governor ' + ms(tm.governor_ms)
    + (isNum(tm.condense_ms) ? ', condense ' + ms(tm.condense_ms) : '') + (isNum(tm.restore_ms) ? ', restore ' + ms(tm.restore_ms) : '')
    + ', backend ' + ms(tm.backend_ttft_ms) + ', other ' + ms(tm.other_ms) + ' ms.'));

  if (Array.isArray(s.governor) && s.governor.length) {
    out.push(h('ul', { class: 'plain' }, s.governor.map((g) => h('li', null,
      'governor ' + (g.kind || 'action') + (g.reason ? ': ' + g.reason : '')
      + (isNum(g.turns_dropped) ? ' · ' + num(g.turns_dropped) + ' turns dropped' : '')
      + (isNum(g.tokens_dropped) ? ' · ' + num(g.tokens_dropped) + ' tokens dropped' : '')
      + (isNum(g.epoch) ? ' · epoch ' + g.epoch : '')))));
  }
  const ws = s.working_set;
  if (ws) out.push(h('p', null, 'Working set: ' + workingSetText(ws)));
  if (s.karma && Array.isArray(s.karma.traces)) {
    out.push(h('p', null, 'Karma epoch ' + num(s.karma.epoch) + ': ' + (s.karma.traces.length ? 'traces ' + s.karma.traces.join(', ') : 'no traces in the prompt')));
  }
  const b = s.budget;
  if (b) {
    out.push(h('p', null, 'Prompt ' + num(b.prompt_tokens) + ' of ' + num(b.num_ctx) + ' context tokens (' + num(b.answer_reserve)
      + ' reserved for the answer) · KV ' + bytes(b.kv_bytes) + ' of ' + bytes(b.kv_budget_bytes) + (isNum(s.epoch) ? ' · epoch ' + s.epoch : '')));
    if (Array.isArray(b.blocks) && b.blocks.length) {
      out.push(table('prompt blocks of turn ' + t.turn, ['block', 'tokens', 'chars'],
        b.blocks.map((x) => [x.block, num(x.tokens), num(x.chars)]), [1, 2]));
    }
  }
  return out;
}

function workingSetText(ws) {
  const parts = ['generation ' + num(ws.generation), num(ws.files) + ' files', num(ws.tokens) + ' tokens'];
  if (isNum(ws.hits)) parts.push(num(ws.hits) + ' hits');
  if (isNum(ws.excerpts_present)) {
    parts.push('excerpts ' + num(ws.excerpts_present) + ' present, ' + num(ws.excerpts_new) + ' new (' + num(ws.excerpt_tokens_new) + ' tokens)');
  }
  if (ws.moved != null && ws.moved !== '') parts.push('moved: ' + text(ws.moved));
  if (isNum(ws.added) && ws.added) parts.push(num(ws.added) + ' pieces added');
  if (isNum(ws.dropped) && ws.dropped) parts.push(num(ws.dropped) + ' pieces dropped');
  return parts.join(' · ');
}

function addBreak(rec, t) {
  const b = t.summary.prefix_break;
  const li = h('li', { class: 'break', 'data-turn': t.turn },
    h('span', { class: 'tag tag-warn' }, '⚠ break'), ' turn ' + t.turn + ' · ',
    h('strong', null, b.block ? b.block + ' block' : 'prefix'), b.reason ? ': ' + b.reason : '');
  rec.breaks.push({ id: t.id, el: li });
  rec.breaksList.append(li);
  while (rec.breaks.length > MAX_BREAKS) rec.breaks.shift().el.remove();
  rec.breaksEl.hidden = false;
}

function removeBreak(rec, id) {
  const i = rec.breaks.findIndex((b) => b.id === id);
  if (i >= 0) { rec.breaks[i].el.remove(); rec.breaks.splice(i, 1); }
  rec.breaksEl.hidden = rec.breaks.length === 0;
}

/**
 * Adds one TURN to its session (creating the session), or replaces the row of the same
 * turn (its seq: the same event heard twice). Side requests outside the conversation
 * share a turn number and still get a row each. Touches only that session's DOM.
 * Returns true when the turn is new.
 */
function applyTurn(ev, container) {
  const s = ev && ev.summary;
  if (!s) return false;
  const key = sessionKey(ev.sigil, ev.session);
  let rec = sessions.get(key);
  if (!rec) {
    rec = newSession(ev.sigil, ev.session);
    sessions.set(key, rec);
    (container || sessionList()).prepend(rec.el);
    if (sessions.size > MAX_SESSIONS) dropOldestSession(rec);
  }
  rec.lastActive = ++activityCounter;
  if (ev.persona) rec.persona = String(ev.persona);

  const turnNo = isNum(s.turn) ? s.turn : (isNum(ev.seq) ? ev.seq : rec.turns.length + 1);
  const id = isNum(ev.seq) ? 'seq' + ev.seq : 'turn' + turnNo;
  const t = {
    id, turn: turnNo, seq: ev.seq, at: ev.at, summary: s,
    cached: cachedOf(s), evaluated: evaluatedOf(s), prompt: promptOf(s),
  };
  buildTurnRow(t);

  const old = rec.turns.findIndex((x) => x.id === id);
  let isNew = true;
  if (old >= 0) {
    isNew = false;
    rec.turns[old].el.replaceWith(t.el);
    rec.turns[old] = t;
    removeBreak(rec, id);
  } else {
    rec.turns.push(t);
    rec.turnsEl.append(t.el);
    while (rec.turns.length > MAX_TURNS) {
      const gone = rec.turns.shift();
      gone.el.remove();
      removeBreak(rec, gone.id);
    }
  }
  if (s.prefix_break) addBreak(rec, t);

  // widths: prompt_tokens against the session's largest prompt
  let max = 0;
  for (const x of rec.turns) max = Math.max(max, x.prompt);
  if (max !== rec.maxPrompt) {
    rec.maxPrompt = max;
    for (const x of rec.turns) sizeBar(x, max);
  } else {
    sizeBar(t, max);
  }
  renderSessionHead(rec);

  if (s.working_set) {
    state.workingSet = { sigil: rec.sigil, session: rec.session, turn: turnNo, at: ev.at, ws: s.working_set };
    if (s.working_set.moved != null && s.working_set.moved !== '' && isNew) {
      const w = s.working_set;
      const pieces = [isNum(w.added) && w.added ? num(w.added) + ' added' : '', isNum(w.dropped) && w.dropped ? num(w.dropped) + ' dropped' : ''].filter(Boolean);
      state.moves.push({ sigil: rec.sigil, session: rec.session, turn: turnNo, at: ev.at, text: text(w.moved) + (pieces.length ? ' (pieces: ' + pieces.join(', ') + ')' : '') });
      if (state.moves.length > MAX_MOVES) state.moves.shift();
    }
  }
  return isNew;
}

function dropOldestSession(keep) {
  let victim = null;
  for (const rec of sessions.values()) {
    if (rec === keep) continue;
    if (!victim || rec.lastActive < victim.lastActive) victim = rec;
  }
  if (victim) {
    victim.el.remove();
    sessions.delete(victim.key);
  }
}

function renderSessionsNote() {
  let turns = 0;
  for (const r of sessions.values()) turns += r.turns.length;
  $('#sessions-note').textContent = sessions.size ? sessions.size + (sessions.size === 1 ? ' session · ' : ' sessions · ') + turns + (turns === 1 ? ' turn shown' : ' turns shown') : '';
  $('#sessions-empty').hidden = sessions.size > 0;
}

// ---------- activity series and chart ----------

function serverNow() {
  return Date.now() / 1000 + state.clockOffset;
}

function bucketStart(unix) {
  const b = state.bucketS;
  return Math.floor(unix / b) * b;
}

/** Extends the series with empty buckets up to the one holding `unix`. Returns true on change. */
function advanceTo(unix) {
  const b = state.bucketS;
  const target = bucketStart(unix);
  const ser = state.series;
  let changed = false;
  if (!ser.length) {
    ser.push({ start: target, requests: 0, evaluated: 0, reused: 0 });
    return true;
  }
  let last = ser[ser.length - 1].start;
  if (target - last > b * MAX_BUCKETS) {   // a long gap: start again from an empty window
    last = target - b * MAX_BUCKETS;
    ser.length = 0;
    ser.push({ start: last, requests: 0, evaluated: 0, reused: 0 });
  }
  while (last < target) {
    last += b;
    ser.push({ start: last, requests: 0, evaluated: 0, reused: 0 });
    changed = true;
  }
  if (ser.length > MAX_BUCKETS) { ser.splice(0, ser.length - MAX_BUCKETS); changed = true; }
  return changed;
}

function addTurnToSeries(ev) {
  const at = unixOf(ev.at);
  if (!Number.isFinite(at)) return;
  if (at > serverNow() + state.bucketS) state.clockOffset = at - Date.now() / 1000;
  advanceTo(at);
  const start = bucketStart(at);
  const bucket = state.series.find((x) => x.start === start);
  if (!bucket) return;   // older than the window
  const s = ev.summary || {};
  bucket.requests += 1;
  bucket.evaluated += evaluatedOf(s);
  bucket.reused += cachedOf(s);
}

let plot = null;
let chartQueued = false;

function cssVar(name) {
  return getComputedStyle(document.documentElement).getPropertyValue(name).trim();
}

function chartData() {
  const ser = state.series;
  // The steps hold each bucket's value to the next bucket's start: a point
  // at the end of the last bucket draws the last one as wide as the others.
  const pts = ser.length ? [...ser, { ...ser[ser.length - 1], start: ser[ser.length - 1].start + state.bucketS }] : ser;
  return [pts.map((x) => x.start), pts.map((x) => x.reused), pts.map((x) => x.evaluated), pts.map((x) => x.requests)];
}

const MIN_VIEW_BUCKETS = 12;

function viewStart(max) {
  const b = state.bucketS;
  const full = max - (MAX_BUCKETS - 1) * b;
  const first = state.series.find((x) => x.requests > 0);
  if (!first) return full;
  return Math.max(full, Math.min(first.start - b, max - (MIN_VIEW_BUCKETS - 1) * b));
}

function makePlot() {
  const wrap = $('#activity-chart');
  if (plot) { plot.destroy(); plot = null; }
  const muted = cssVar('--muted') || '#59636e';
  const grid = cssVar('--grid') || '#e6e9ed';
  const font = '11px system-ui, -apple-system, "Segoe UI", Roboto, sans-serif';
  const axis = { stroke: muted, font, labelFont: font, grid: { stroke: grid, width: 1 }, ticks: { stroke: grid, width: 1, size: 4 } };
  const stepped = uPlot.paths.stepped({ align: 1 });
  plot = new uPlot({
    width: Math.max(200, wrap.clientWidth || 300),
    height: chartHeight(),
    legend: { show: false },
    cursor: { drag: { x: false, y: false, setScale: false }, points: { size: 7 } },
    scales: {
      // the window from the first active bucket (at least MIN_VIEW_BUCKETS,
      // at most MAX_BUCKETS) to the newest: a new daemon's first minutes
      // are not squeezed into the right edge of ten
      x: { time: true, range: (u, min, max) => [viewStart(max - state.bucketS), max] },
      tok: { range: (u, min, max) => [0, Math.max(10, max || 0) * 1.08] },
      req: { range: (u, min, max) => [0, Math.max(2, max || 0) * 1.08] },
    },
    axes: [
      { ...axis, space: 70, values: (u, splits) => splits.map((v) => clock(new Date(v * 1000))) }, // local HH:MM:SS: no date line to clip
      { ...axis, scale: 'tok', size: 46, values: (u, splits) => splits.map(compact) },
      { ...axis, scale: 'req', side: 1, size: 34, grid: { show: false }, values: (u, splits) => splits.map((v) => (Number.isInteger(v) ? String(v) : '')) },
    ],
    series: [
      {},
      { label: 'reused', scale: 'tok', stroke: cssVar('--cached'), fill: cssVar('--cached-fill'), width: 2, paths: stepped, points: { show: false } },
      { label: 'evaluated', scale: 'tok', stroke: cssVar('--evaluated'), fill: cssVar('--evaluated-fill'), width: 2, paths: stepped, points: { show: false } },
      { label: 'requests', scale: 'req', stroke: cssVar('--req'), width: 1.5, dash: [5, 3], paths: stepped, points: { show: false } },
    ],
    hooks: {
      setCursor: [(u) => {
        const i = u.cursor.idx;
        const b = i == null ? null : state.series[i];
        $('#activity-readout').textContent = b ? 'At ' + clock(new Date(b.start * 1000)) + ': ' + bucketText(b) : '';
      }],
    },
  }, chartData(), wrap);
}

function bucketText(b) {
  return num(b.requests) + (b.requests === 1 ? ' request' : ' requests') + ', ' + num(b.reused) + ' tokens reused, ' + num(b.evaluated) + ' evaluated';
}

function renderChartNow() {
  chartQueued = false;
  const ser = state.series;
  if (!plot) makePlot(); else plot.setData(chartData());
  const wrap = $('#activity-chart');
  const bs = state.bucketS;
  $('#activity-bucket').textContent = 'per ' + bs + ' s bucket · last ' + dur(bs * 1000 * Math.max(ser.length, 1));
  if (!ser.length) { wrap.setAttribute('aria-label', 'Activity chart: no data yet'); return; }
  const last = ser[ser.length - 1];
  let req = 0, reused = 0, evaluated = 0;
  for (const b of ser) { req += b.requests; reused += b.reused; evaluated += b.evaluated; }
  const window = dur(bs * 1000 * ser.length);
  const latest = 'Latest bucket, from ' + clock(new Date(last.start * 1000)) + ' (' + bs + ' s): ' + bucketText(last) + '.';
  const total = 'Over the last ' + window + ': ' + num(req) + (req === 1 ? ' request' : ' requests') + ', ' + num(reused) + ' tokens reused, ' + num(evaluated) + ' evaluated'
    + (reused + evaluated > 0 ? ' (' + Math.floor(100 * reused / (reused + evaluated)) + '% reused)' : '') + '.';
  wrap.setAttribute('aria-label', 'Activity chart of tokens reused and evaluated and requests per ' + bs + ' s. ' + latest + ' ' + total);
  $('#activity-summary').textContent = latest;
  $('#activity-totals').replaceChildren(
    h('h3', null, 'Last ' + window),
    stats([
      ['requests', num(req)],
      ['reused', compact(reused), 'tokens'],
      ['evaluated', compact(evaluated), 'tokens'],
      ['reuse rate', reused + evaluated > 0 ? Math.floor(100 * reused / (reused + evaluated)) + '%' : '—'],
    ], 'stats stats-tiles'));
}

function renderChart() {
  if (chartQueued) return;
  chartQueued = true;
  requestAnimationFrame(renderChartNow);
}

// ---------- status panels ----------

function renderHeader() {
  const v = state.viewer;
  const vEl = $('#viewer');
  if (v && v.sigil) {
    vEl.replaceChildren('viewing as ', h('strong', null, String(v.sigil)));
    if (v.admin) vEl.append(' ', h('span', { class: 'chip' }, 'admin'));
  } else {
    vEl.textContent = 'viewer: not known';
  }
  const ver = state.version || (state.status && state.status.version) || '';
  const verEl = $('#version');
  verEl.textContent = ver;
  verEl.hidden = !ver;
  const st = state.status;
  const ready = $('#ready');
  if (st && st.ready === false) { ready.textContent = '⚠ not ready'; ready.hidden = false; } else { ready.hidden = true; }
}

function notReady(st, what) {
  if (st && st.ready === false) {
    return h('p', { class: 'alert' }, h('strong', null, '⚠ Not ready: '), st.error || 'the daemon is still starting', what ? ' — ' + what : '');
  }
  return h('p', { class: 'muted' }, what || 'Nothing to show.');
}

function renderBackend() {
  const st = state.status;
  const body = $('#backend-body');
  const note = $('#backend-note');
  body.replaceChildren();
  note.textContent = '';
  if (!st) { body.append(h('p', { class: 'muted' }, 'No status yet.')); return; }
  if (st.ready === false) body.append(notReady(st));
  const b = st.backend;
  if (b) {
    note.textContent = [b.kind, b.mode].filter(Boolean).join(' · ');
    body.append(stats([
      ['model', b.model],
      ['server', b.version],
      ['context', num(b.num_ctx), 'tokens'],
      ['slots', num(b.slots)],
      ['prompt format', b.format && b.format.name],
      ['KV cache', b.kv_cache_type],
    ]));
    if (b.format && b.format.reason) body.append(h('p', { class: 'note' }, 'Format: ' + b.format.reason + (b.format.append_only === false ? ' (not append-only)' : '')));
  } else if (st.ready !== false) {
    body.append(h('p', { class: 'muted' }, 'No backend reported.'));
  }

  const w = st.window;
  const plan = st.hardware && st.hardware.plan;
  if (w || plan) {
    body.append(h('h3', null, 'Memory'));
    const mem = w && w.memory;
    body.append(stats([
      ['KV cache', w ? bytes(w.kv_bytes) : null, w && isNum(w.num_ctx) ? '· ' + num(w.num_ctx) + ' ctx' : ''],
      ['weights', w ? bytes(w.weights_bytes) : null],
      ['headroom', w ? bytes(w.headroom_bytes) : null],
      ['planned', plan ? bytes(plan.planned_bytes) : null, plan && plan.resident === false ? '(not resident)' : ''],
      ['memory free', mem ? bytes(mem.free_bytes) : null, mem ? 'of ' + bytes(mem.total_bytes) + (mem.source ? ' (' + mem.source + ')' : '') : ''],
    ]));
    if (mem && isNum(mem.free_bytes) && isNum(mem.total_bytes) && mem.total_bytes > 0) {
      const used = 1 - mem.free_bytes / mem.total_bytes;
      const meter = h('div', { class: 'meter', role: 'img', 'aria-label': 'memory in use ' + Math.round(100 * used) + '%: ' + bytes(mem.total_bytes - mem.free_bytes) + ' of ' + bytes(mem.total_bytes) },
        h('span', { class: 'meter-fill' }));
      meter.firstChild.style.width = (100 * used).toFixed(1) + '%';
      body.append(h('div', { class: 'meter-row' }, meter, h('span', { class: 'small muted' }, Math.round(100 * used) + '% in use')));
    }
    if (w && w.reason) body.append(h('p', { class: 'note' }, 'Window: ' + w.reason));
  }

  const p = st.personas;
  if (p && Array.isArray(p.personas)) {
    body.append(h('h3', null, 'Personas'));
    body.append(stats([['budget', bytes(p.budget_bytes)], ['planned', bytes(p.planned_bytes)], ['personas', num(p.personas.length)]]));
    body.append(table('personas', ['persona', 'state', 'planned', 'resident', 'saved', 'evac.', 'restores'],
      p.personas.map((x) => [
        h('span', null, h('strong', null, x.name || '?'), x.default ? h('span', { class: 'chip' }, 'default') : null,
          x.model ? h('span', { class: 'cell-note' }, x.model) : null),
        h('span', { class: 'state state-' + String(x.state || '').replace(/[^a-z]/gi, '') }, x.state || '—'),
        bytes(x.planned_bytes),
        x.rss_bytes ? bytes(x.rss_bytes) + (x.off_by ? ' (' + x.off_by + ')' : '') : '—',
        x.saved_slots || x.saved_tokens || x.saved_bytes
          ? num(x.saved_slots) + ' slot' + (x.saved_slots === 1 ? '' : 's') + ' · ' + num(x.saved_tokens) + ' tokens · ' + bytes(x.saved_bytes)
          : '—',
        num(x.evacuations), num(x.restores),
      ]), [2, 3, 5, 6]));
  }

  const r = st.reload;
  if (r && r.at) {
    body.append(h('p', { class: r.ok === false ? 'alert small' : 'note' },
      (r.ok === false ? '⚠ Config reload at ' + timeOf(r.at) + ' failed: ' + (r.error || 'unknown error') : 'Config reloaded at ' + timeOf(r.at))));
  }
}

// sessionWho names a session of the status: an admin's status names each
// by the daemon's id, the client's id then "@" and its sigil's name.
function sessionWho(id) {
  const i = state.viewer && state.viewer.admin ? id.lastIndexOf('@') : -1;
  return i > 0 ? `session ${id.slice(0, i)} · sigil ${id.slice(i + 1)}` : 'session ' + id;
}

function slotWho(s) {
  if (s.session) return sessionWho(s.session);
  if (s.busy || (s.held_tokens || 0) > 0) return "another sigil's session";
  return 'no session held';
}

function renderSlots() {
  const st = state.status;
  const body = $('#slots-body');
  const note = $('#slots-note');
  body.replaceChildren();
  note.textContent = '';
  const sch = st && st.scheduler;
  if (!sch) { body.append(notReady(st, 'no scheduler yet')); return; }
  const slots = Array.isArray(sch.slots) ? sch.slots : [];
  const numCtx = (st.window && st.window.num_ctx) || (st.backend && st.backend.num_ctx) || 0;
  const busy = slots.filter((s) => s.busy).length;
  note.textContent = busy + ' of ' + slots.length + ' busy';
  const ul = h('ul', { class: 'slot-list' });
  for (const s of slots) {
    const held = isNum(s.held_tokens) ? s.held_tokens : 0;
    const meter = h('div', { class: 'meter', role: 'img', 'aria-label': 'slot ' + s.slot + ' holds ' + num(held) + (numCtx ? ' of ' + num(numCtx) : '') + ' tokens' },
      h('span', { class: 'meter-fill' + (s.busy ? ' busy' : '') }));
    meter.firstChild.style.width = (numCtx ? Math.min(100, 100 * held / numCtx) : 0) + '%';
    const facts = ['holds ' + num(held) + (numCtx ? ' of ' + num(numCtx) : '') + ' tokens'];
    if (s.prefix) facts.push('prefix ' + String(s.prefix).slice(0, 12));
    if (isNum(s.measured_cached)) facts.push('measured cached ' + num(s.measured_cached));
    ul.append(h('li', { class: 'slot', 'data-slot': s.slot, 'data-busy': String(!!s.busy) },
      h('div', { class: 'slot-head' },
        h('strong', null, 'slot ' + s.slot), ' ',
        h('span', { class: 'badge ' + (s.busy ? 'badge-busy' : 'badge-idle') }, s.busy ? 'busy' : 'idle'), ' ',
        h('span', { class: 'slot-who' }, slotWho(s))),
      meter,
      h('p', { class: 'small muted' }, facts.join(' · '))));
  }
  if (!slots.length) body.append(h('p', { class: 'muted' }, 'No slots reported.'));
  body.append(ul);

  body.append(h('h3', null, 'Queue'));
  const waiting = Array.isArray(sch.waiting) ? sch.waiting : [];
  if (waiting.length) {
    body.append(h('ol', { class: 'queue' }, waiting.map((w) => h('li', null,
      h('span', null, w.session ? sessionWho(w.session) : "another sigil's request"), ' — waiting ' + dur(w.waiting_ms)))));
  } else {
    body.append(h('p', { class: 'muted small' }, 'No request is waiting for a slot.'));
  }
  const wfs = sch.waiting_for_session || 0;
  body.append(h('p', { class: 'small' + (wfs ? '' : ' muted') },
    wfs === 1 ? '1 request is waiting for its session’s previous turn.' : num(wfs) + ' requests are waiting for their session’s previous turn.'));
}

function planWords(plan) {
  const m = String((plan && plan.mode) || '').toLowerCase();
  if (m === 'cag') return 'Whole codebase in every prompt (CAG): the prompt prefix stays the same, so the server reuses it.';
  if (m === 'rag') return 'Retrieval (RAG): each turn carries a working set of the relevant files, not the whole codebase.';
  if (m === 'none') return 'No codebase in the prompts.';
  return m ? 'Mode ' + m + '.' : '';
}

function renderCodex() {
  const st = state.status;
  const body = $('#codex-body');
  const note = $('#codex-note');
  body.replaceChildren();
  note.textContent = '';
  const c = st && st.codex;
  if (!c) {
    body.append(st && st.ready === false ? notReady(st, 'no codex yet') : h('p', { class: 'muted' }, 'No codex loaded.'));
    renderWorkingSet();
    return;
  }
  const plan = c.plan || {};
  note.textContent = plan.mode ? String(plan.mode).toUpperCase() : '';
  body.append(h('p', { class: 'lead' }, h('strong', null, c.name || 'codex'), c.root ? h('span', { class: 'path' }, ' ' + c.root) : null));
  body.append(stats([
    ['files', num(c.files)],
    ['tokens', num(c.tokens), c.tokens_exact === false ? '(estimate)' : ''],
    ['mode', plan.mode ? String(plan.mode).toUpperCase() : null],
    ['stable blocks', isNum(plan.stable_tokens) && plan.stable_tokens >= 0 ? num(plan.stable_tokens) : null, 'tokens'],
    ['CAG threshold', isNum(plan.threshold_tokens) ? num(plan.threshold_tokens) : null, 'tokens'],
  ]));
  const words = planWords(plan);
  if (words) body.append(h('p', null, words));
  if (plan.reason) body.append(h('p', { class: 'note' }, 'Why: ' + plan.reason));

  if (Array.isArray(c.largest) && c.largest.length) {
    body.append(h('h3', null, 'Largest files'));
    const max = Math.max(...c.largest.map((x) => x.tokens || 0), 1);
    body.append(h('ol', { class: 'largest' }, c.largest.map((x) => {
      const m = h('span', { class: 'minibar', 'aria-hidden': 'true' }, h('span', null));
      m.firstChild.style.width = (100 * (x.tokens || 0) / max).toFixed(1) + '%';
      return h('li', null, h('span', { class: 'path' }, x.path), h('span', { class: 'num' }, num(x.tokens) + ' tokens'), m);
    })));
  }

  const extras = [];
  const redCount = isNum(c.redactions) ? c.redactions : (Array.isArray(c.redacted) ? c.redacted.length : null);
  if (redCount != null) extras.push(h('p', { class: 'small' }, num(redCount) + (redCount === 1 ? ' redaction' : ' redactions') + (c.redacting === false ? ' (redaction is off)' : '')));
  if (Array.isArray(c.redacted) && c.redacted.length) {
    extras.push(h('ul', { class: 'plain small' }, c.redacted.map((r) => h('li', null, h('span', { class: 'path' }, r.path || text(r)),
      r.kind || r.reason ? ' — ' + (r.kind || r.reason) : '', isNum(r.count) ? ' (' + num(r.count) + ')' : ''))));
  }
  if (Array.isArray(c.skipped)) {
    extras.push(h('p', { class: 'small' }, c.skipped.length ? num(c.skipped.length) + (c.skipped.length === 1 ? ' file skipped:' : ' files skipped:') : 'No files skipped.'));
    if (c.skipped.length) {
      extras.push(h('ul', { class: 'plain small' }, c.skipped.slice(0, 50).map((s) => h('li', null,
        h('span', { class: 'path' }, s.path || text(s)), s.reason ? ' — ' + s.reason : ''))));
    }
  } else if (isNum(c.skipped) || isNum(c.skipped_files)) {
    const n = isNum(c.skipped) ? c.skipped : c.skipped_files;
    extras.push(h('p', { class: 'small' }, num(n) + (n === 1 ? ' file skipped.' : ' files skipped.')));
  }
  if (extras.length) body.append(h('h3', null, 'Redactions and skips'), ...extras);
  renderWorkingSet();
}

function renderWorkingSet() {
  const box = $('#codex-ws');
  box.replaceChildren();
  const w = state.workingSet;
  if (!w && !state.moves.length) return;
  box.append(h('h3', null, 'Working set'));
  if (w) {
    box.append(h('p', { class: 'small muted' }, 'From turn ' + w.turn + ' of session ' + w.session + ' (sigil ' + w.sigil + ')' + (w.at ? ' at ' + timeOf(w.at) : '')));
    const ws = w.ws;
    box.append(stats([
      ['generation', num(ws.generation)],
      ['files', num(ws.files)],
      ['tokens', num(ws.tokens)],
      ['hits', isNum(ws.hits) ? num(ws.hits) : null],
      ['new excerpts', isNum(ws.excerpts_new) ? num(ws.excerpts_new) : null, isNum(ws.excerpt_tokens_new) ? '(' + num(ws.excerpt_tokens_new) + ' tokens)' : ''],
    ]));
  }
  if (state.moves.length) {
    box.append(h('h4', null, 'Recent moves'));
    box.append(h('ul', { class: 'plain small moves' }, state.moves.slice().reverse().map((m) => h('li', null,
      h('strong', null, 'turn ' + m.turn), ' · ' + m.session + ' (' + m.sigil + ')' + (m.at ? ' ' + timeOf(m.at) : '') + ': ' + m.text))));
  }
}

function renderKarma() {
  const body = $('#karma-body');
  const note = $('#karma-note');
  body.replaceChildren();
  note.textContent = '';
  const k = state.karma;
  if (!k) {
    const off = state.status && state.status.karma === false;
    body.append(h('p', { class: 'muted' }, off || state.karma === null ? 'Karma is off.' : 'Karma is off or not reported.'));
    return;
  }
  note.textContent = num(k.traces) + ' traces';
  body.append(stats([
    ['traces', num(k.traces)],
    ['recorded', num(k.recorded)],
    ['verified', num(k.verified)],
    ['rejected', num(k.rejected)],
    ['pinned', num(k.pinned)],
    ['stale', num(k.stale)],
  ], 'stats stats-tiles'));
  body.append(h('p', { class: 'note' }, 'Verified past answers are offered to later prompts; rejected and stale ones are not.'));
}

function renderEnvironment() {
  const st = state.status;
  const body = $('#environment-body');
  const note = $('#environment-note');
  body.replaceChildren();
  note.textContent = '';
  if (!st) { body.append(h('p', { class: 'muted' }, 'No status yet.')); return; }
  const e = st.environment;
  if (e) {
    body.append(stats([['VRAM', e.vram], ['GPU', e.gpu], ['power', e.power], ['connectivity', e.connectivity]], 'stats stats-tiles'));
  } else {
    body.append(st.ready === false ? notReady(st, 'no environment reading yet') : h('p', { class: 'muted' }, 'No environment reading.'));
  }
  const hw = st.hardware;
  if (hw) {
    const facts = [];
    if (hw.source) facts.push('source ' + hw.source);
    if (isNum(hw.gpus)) facts.push(num(hw.gpus) + (hw.gpus === 1 ? ' GPU' : ' GPUs'));
    if (isNum(hw.free_bytes) && isNum(hw.total_bytes)) facts.push(bytes(hw.free_bytes) + ' free of ' + bytes(hw.total_bytes));
    if (isNum(hw.pressure)) facts.push('pressure ' + Math.round(100 * hw.pressure) + '%');
    if (hw.host && isNum(hw.host.load1)) facts.push('load ' + hw.host.load1);
    if (hw.at) facts.push('read ' + timeOf(hw.at));
    if (facts.length) body.append(h('p', { class: 'small' }, 'Hardware: ' + facts.join(' · ')));
    if (hw.note) body.append(h('p', { class: 'note' }, hw.note));
  }
  const b = st.bands;
  if (b) {
    note.textContent = num(b.readings) + ' readings';
    const changes = ['environment', 'vram', 'gpu', 'power', 'connectivity'].filter((k) => isNum(b[k]));
    body.append(h('h3', null, 'Band changes'));
    body.append(h('p', { class: 'small' }, num(b.readings) + ' readings · ' + changes.map((k) => k + ' ' + num(b[k])).join(' · ')));
  }
  renderBands();
}

function bandDiff(ch) {
  const from = (ch && ch.from) || {};
  const to = (ch && ch.to) || {};
  const keys = [...new Set([...Object.keys(from), ...Object.keys(to)])];
  const changed = keys.filter((k) => from[k] !== to[k]);
  return (changed.length ? changed : keys).map((k) => k + ' ' + (from[k] ?? '—') + ' → ' + (to[k] ?? '—')).join(', ');
}

function renderBands() {
  const box = $('#bands-body');
  box.replaceChildren();
  const list = state.bands;
  if (!list.length) {
    box.append(h('p', { class: 'muted small' }, 'No band changes seen.'));
    return;
  }
  box.append(h('h4', null, 'Recent changes'));
  box.append(h('ol', { class: 'plain small bands', reversed: true }, list.slice().reverse().map((c) => h('li', null,
    h('span', { class: 'time' }, timeOf(c.at)), ' ', bandDiff(c)))));
}

function renderPanels() {
  renderHeader();
  renderBackend();
  renderSlots();
  renderCodex();
  renderEnvironment();
}

function touch() {
  $('#updated').textContent = 'updated ' + clock(new Date());
}

// ---------- events ----------

function onSnapshot(d) {
  state.viewer = d.viewer || null;
  state.version = d.version || '';
  state.bucketS = isNum(d.bucket_s) && d.bucket_s > 0 ? d.bucket_s : 10;
  state.status = d.status || null;
  state.karma = 'karma' in d ? d.karma : undefined;
  state.bands = Array.isArray(d.bands) ? d.bands.slice(-MAX_BANDS) : [];
  state.series = (Array.isArray(d.series) ? d.series : [])
    .filter((b) => b && isNum(b.start))
    .map((b) => ({ start: b.start, requests: b.requests || 0, evaluated: b.evaluated || 0, reused: b.reused || 0 }))
    .slice(-MAX_BUCKETS);
  state.workingSet = null;
  state.moves = [];

  // clock: the server's newest bucket is (about) now
  const now = Date.now() / 1000;
  state.clockOffset = 0;
  if (state.series.length) {
    const last = state.series[state.series.length - 1].start;
    if (now < last - state.bucketS || now > last + 2 * state.bucketS) state.clockOffset = last + state.bucketS / 2 - now;
  }
  advanceTo(serverNow());

  // sessions: rebuilt off-document, then swapped in at once
  sessions.clear();
  const frag = document.createDocumentFragment();
  for (const t of Array.isArray(d.turns) ? d.turns : []) applyTurn(t, frag);
  sessionList().replaceChildren(frag);
  renderSessionsNote();

  renderPanels();
  renderKarma();
  renderChart();
  touch();
  setState('live');
}

function onTurn(d) {
  const isNew = applyTurn(d);
  renderSessionsNote();
  if (isNew) { addTurnToSeries(d); renderChart(); }
  if (d && d.summary && d.summary.working_set) renderWorkingSet();
  touch();
}

function onStatus(d) {
  state.status = d || null;
  renderPanels();
  touch();
}

function onBand(d) {
  if (!d) return;
  const last = state.bands[state.bands.length - 1];
  if (last && last.at === d.at && JSON.stringify(last.to) === JSON.stringify(d.to)) return; // in the snapshot already
  state.bands.push(d);
  if (state.bands.length > MAX_BANDS) state.bands.shift();
  renderBands();
  touch();
}

function onKarma(d) {
  state.karma = d || null;
  renderKarma();
  touch();
}

const CONN_TEXT = {
  connecting: 'Connecting to ctxd…',
  live: 'Live',
  reconnecting: 'Connection lost — reconnecting…',
  closed: 'Closed',
};

function setState(s, text) {
  const t = text || CONN_TEXT[s];
  if (document.body.dataset.state === s && $('#conn-text').textContent === t) return;
  document.body.dataset.state = s;
  $('#conn-text').textContent = t;
  if (s === 'live') state.everLive = true;
}

// stop ends the stream for good and says why: the daemon refused the page
// (its token expired or was revoked); a new address is needed.
function stop(why) {
  if (source) source.close();
  source = null;
  clearTimeout(retryTimer);
  retryTimer = 0;
  setState('closed', `Closed: ${why} Run \`ctxd dashboard\` for a new address.`);
}

let source = null;
let retryTimer = 0;
let retryDelay = 1000;

function connect() {
  retryTimer = 0;
  const es = new EventSource('../v1/dashboard/events' + location.search);
  source = es;
  const listen = (name, fn) => es.addEventListener(name, (e) => {
    let d;
    try { d = JSON.parse(e.data); } catch { return; }
    fn(d);
  });
  listen('snapshot', (d) => { retryDelay = 1000; onSnapshot(d); });
  listen('turn', onTurn);
  listen('status', onStatus);
  listen('band', onBand);
  listen('karma', onKarma);
  listen('refused', (d) => stop(d && d.error ? d.error + '.' : 'the daemon refused this page.'));
  es.addEventListener('error', (e) => {
    if (es !== source || e.data !== undefined) return;
    setState('reconnecting');
    if (es.readyState === EventSource.CLOSED && !retryTimer) {
      // The browser gave up (an HTTP error). A page the daemon no longer
      // lets in (its token expired, or the daemon restarted and forgot it)
      // stops; otherwise try again, backing off.
      es.close();
      retryTimer = setTimeout(async () => {
        retryTimer = 0;
        try {
          const r = await fetch('./' + location.search, { method: 'HEAD', cache: 'no-store' });
          if (r.status === 401 || r.status === 403) {
            stop('this address no longer opens the dashboard (its token expired or was revoked, or the daemon restarted).');
            return;
          }
        } catch { /* the daemon is down: keep trying */ }
        connect();
      }, retryDelay);
      retryDelay = Math.min(retryDelay * 2, 30000);
    }
  });
}

// ---------- start ----------

function start() {
  renderSessionsNote();
  renderChart();
  const wrap = $('#activity-chart');
  if ('ResizeObserver' in window) {
    let w = 0;
    new ResizeObserver(() => {
      requestAnimationFrame(() => {
        const cw = wrap.clientWidth;
        if (plot && cw > 0 && (cw !== w || plot.height !== chartHeight())) { w = cw; plot.setSize({ width: cw, height: chartHeight() }); }
      });
    }).observe(wrap);
  }
  const dark = window.matchMedia('(prefers-color-scheme: dark)');
  dark.addEventListener('change', () => { if (plot) { makePlot(); renderChart(); } });
  // let the chart move with time: an empty bucket per bucket_s
  setInterval(() => { if (advanceTo(serverNow())) renderChart(); }, 1000);
  connect();
}

start();
