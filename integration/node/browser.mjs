// A real browser for the dashboard's tests: headless Chromium (Debian's
// package, at CHROMIUM or /usr/bin/chromium) driven by playwright-core.
// The Go test sends one JSON command per line on stdin and reads one JSON
// answer per line on stdout: {"ok":true,...} or {"ok":false,"error":"..."}.
//
// Commands:
//   open {url, width, height, scale}  a new page (closing the last) at the
//                                     viewport given; console errors and
//                                     page errors are collected from now
//   wait {selector, text?, timeout}   until selector matches (and its text
//                                     holds text); answers the ms waited
//   count {selector}                  how many elements match
//   text {selector}                   the first match's innerText
//   eval {js}                         the value of a JS expression
//   press {key}                       a key press; answers what has focus
//   screenshot {path, fullPage}
//   errors                            the console and page errors so far
//   close
import { chromium } from 'playwright-core';
import readline from 'node:readline';

const executablePath = process.env.CHROMIUM || '/usr/bin/chromium';
const browser = await chromium.launch({
  executablePath,
  // --no-sandbox: the tests run as root in CI, where Chromium's sandbox
  // refuses to start.
  args: ['--no-sandbox', '--disable-gpu', '--disable-dev-shm-usage'],
});
let context = null;
let page = null;
let errors = [];

async function open(cmd) {
  if (context) await context.close();
  errors = [];
  context = await browser.newContext({
    viewport: { width: cmd.width || 1280, height: cmd.height || 900 },
    deviceScaleFactor: cmd.scale || 1,
  });
  page = await context.newPage();
  page.on('console', (m) => {
    if (m.type() === 'error' || m.type() === 'warning') errors.push(`console ${m.type()}: ${m.text()}`);
  });
  page.on('pageerror', (e) => errors.push(`page error: ${e.message}`));
  page.on('requestfailed', (r) => {
    // The event stream is cut when a page closes: not the page's fault.
    if (!r.url().includes('/v1/dashboard/events')) errors.push(`request failed: ${r.url()} ${r.failure()?.errorText}`);
  });
  const resp = await page.goto(cmd.url, { waitUntil: 'load' });
  if (!resp || resp.status() !== 200) throw new Error(`GET page: ${resp ? resp.status() : 'no response'}`);
  return {};
}

async function wait(cmd) {
  const start = Date.now();
  const timeout = cmd.timeout || 10000;
  await page.waitForFunction(
    ([sel, text]) => [...document.querySelectorAll(sel)].some((e) => !text || e.innerText.includes(text)),
    [cmd.selector, cmd.text || ''],
    { timeout, polling: 'raf' },
  );
  return { ms: Date.now() - start };
}

const handlers = {
  open,
  wait,
  count: async (c) => ({ value: await page.locator(c.selector).count() }),
  text: async (c) => ({ value: await page.locator(c.selector).first().innerText() }),
  eval: async (c) => ({ value: await page.evaluate(c.js) }),
  press: async (c) => {
    await page.keyboard.press(c.key);
    return {
      value: await page.evaluate(() => {
        const e = document.activeElement;
        if (!e) return '';
        const s = e.closest('[data-session]');
        return `${e.tagName.toLowerCase()}${e.id ? '#' + e.id : ''}${s ? ' session=' + s.dataset.session : ''}`;
      }),
    };
  },
  screenshot: async (c) => {
    await page.screenshot({ path: c.path, fullPage: !!c.fullPage });
    return {};
  },
  errors: async () => ({ value: errors }),
  close: async () => {
    await browser.close();
    process.exit(0);
  },
};

const rl = readline.createInterface({ input: process.stdin });
for await (const line of rl) {
  let out;
  try {
    const cmd = JSON.parse(line);
    const h = handlers[cmd.op];
    if (!h) throw new Error(`unknown op ${cmd.op}`);
    out = { ok: true, ...(await h(cmd)) };
  } catch (e) {
    out = { ok: false, error: String(e && e.message ? e.message : e) };
  }
  process.stdout.write(JSON.stringify(out) + '\n');
}
await browser.close();
