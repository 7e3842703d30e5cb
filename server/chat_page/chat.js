// tandem's chat page: a conversation through the server's own /v1/chat/completions (stream: true,
// so the server applies the model's chat template), with each answer's TTFT, TPOT and token
// counts measured here, and a live view of the KV cache from /metrics.
// Model text is only ever set as textContent: it is data, never markup.
"use strict";

(() => {
  const $ = (id) => document.getElementById(id);
  const conversation = [];  // {role, content} of the turns so far (the system prompt is added per request)
  let running = null;       // the AbortController of the answer being streamed

  // ---- the API key: kept for this tab only, sent as a bearer token on every API call ----
  const keyInput = $("key");
  keyInput.value = sessionStorage.getItem("tandem.key") || "";
  keyInput.addEventListener("change", () => {
    sessionStorage.setItem("tandem.key", keyInput.value.trim());
    loadModel();
    pollKv();
  });

  function headers(json) {
    const h = {};
    if (json) h["Content-Type"] = "application/json";
    const key = keyInput.value.trim();
    if (key) h["Authorization"] = "Bearer " + key;
    return h;
  }

  function element(tag, cls, text) {
    const e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined) e.textContent = text;
    return e;
  }

  async function errorMessage(resp) {
    try {
      const j = await resp.json();
      if (j && j.error && j.error.message) return `${resp.status}: ${j.error.message}`;
    } catch (_) { /* not JSON */ }
    return `HTTP ${resp.status}`;
  }

  async function loadModel() {
    try {
      const r = await fetch("/v1/models", { headers: headers(false), cache: "no-store" });
      if (!r.ok) {
        $("model").textContent = r.status === 401 ? "model: (enter the API key)" : "model: ?";
        return;
      }
      const j = await r.json();
      $("model").textContent = "model: " + (j.data && j.data[0] ? j.data[0].id : "?");
    } catch (_) {
      $("model").textContent = "model: (server unreachable)";
    }
  }

  // ---- the conversation ----
  const log = $("log");
  function stickToBottom() { log.scrollTop = log.scrollHeight; }

  function addMessage(role, text) {
    const hint = $("hint");
    if (hint) hint.remove();
    const box = element("div", "msg " + role);
    box.appendChild(element("div", "role", role));
    const body = element("div", "text", text);
    const stats = element("div", "stats");
    box.append(body, stats);
    log.appendChild(box);
    stickToBottom();
    return { box, body, stats };
  }

  function ms(x) { return x < 10 ? x.toFixed(1) : Math.round(x).toString(); }

  // TTFT: request sent -> first content. TPOT: the time after the first token over the tokens
  // after it. Tokens: the server's usage count when it sent one, else the content chunks seen.
  function statsText(m, final) {
    if (m.tFirst === null) return final ? "" : "waiting for the first token…";
    const tokens = m.usage ? m.usage.completion_tokens : m.chunks;
    const parts = [`TTFT ${ms(m.tFirst - m.t0)} ms`];
    if (tokens > 1 && m.tLast > m.tFirst) {
      const tpot = (m.tLast - m.tFirst) / (tokens - 1);
      parts.push(`TPOT ${ms(tpot)} ms/token (${(1000 / tpot).toFixed(1)} tok/s)`);
    }
    parts.push(`${tokens} token${tokens === 1 ? "" : "s"}` + (m.usage ? ` (prompt ${m.usage.prompt_tokens})` : ""));
    if (final && m.finish) parts.push(`finish: ${m.finish}`);
    return parts.join(" · ");
  }

  // Calls onEvent with each parsed `data:` object of a server-sent event stream.
  async function readEvents(resp, onEvent) {
    const reader = resp.body.getReader();
    const decoder = new TextDecoder();
    let buf = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buf += decoder.decode(value, { stream: true });
      let cut;
      while ((cut = buf.indexOf("\n\n")) >= 0) {
        const event = buf.slice(0, cut);
        buf = buf.slice(cut + 2);
        for (const line of event.split("\n")) {
          if (!line.startsWith("data:")) continue;
          const data = line.slice(5).trim();
          if (data && data !== "[DONE]") onEvent(JSON.parse(data));
        }
      }
    }
  }

  function requestBody() {
    const messages = [];
    const system = $("system").value.trim();
    if (system) messages.push({ role: "system", content: system });
    messages.push(...conversation);
    const body = { messages, stream: true, stream_options: { include_usage: true } };
    const maxTokens = parseInt($("max-tokens").value, 10);
    if (maxTokens > 0) body.max_tokens = maxTokens;
    const temperature = parseFloat($("temperature").value);
    if (temperature >= 0 && temperature <= 2) body.temperature = temperature;
    return body;
  }

  async function ask(text) {
    conversation.push({ role: "user", content: text });
    addMessage("user", text);
    const out = addMessage("assistant", "");
    out.box.classList.add("streaming");
    const m = { t0: performance.now(), tFirst: null, tLast: null, chunks: 0, usage: null, finish: null };
    let answer = "";
    running = new AbortController();
    setBusy(true);
    try {
      const resp = await fetch("/v1/chat/completions", {
        method: "POST", headers: headers(true), body: JSON.stringify(requestBody()), signal: running.signal,
      });
      if (!resp.ok) throw new Error(await errorMessage(resp));
      await readEvents(resp, (j) => {
        if (j.error) throw new Error(j.error.message);
        if (j.usage) m.usage = j.usage;
        const choice = j.choices && j.choices[0];
        if (!choice) return;
        if (choice.finish_reason) m.finish = choice.finish_reason;
        const piece = choice.delta && choice.delta.content;
        if (!piece) return;
        const now = performance.now();
        if (m.tFirst === null) {
          m.tFirst = now;
          pollKv();  // the blocks this answer holds, at once
        }
        m.tLast = now;
        m.chunks++;
        answer += piece;
        out.body.textContent = answer;
        out.stats.textContent = statsText(m, false);
        stickToBottom();
      });
      out.stats.textContent = statsText(m, true);
    } catch (e) {
      if (e.name === "AbortError") {
        m.finish = "stopped";
        out.stats.textContent = statsText(m, true) || "stopped";
      } else {
        out.box.classList.add("error");
        out.stats.textContent = "error: " + e.message;
      }
    } finally {
      running = null;
      out.box.classList.remove("streaming");
      out.box.dataset.done = "1";  // for scripts driving the page
      // A failed turn leaves no half-turn behind: the user may simply send again.
      if (answer) conversation.push({ role: "assistant", content: answer });
      else conversation.pop();
      setBusy(false);
      pollKv();
    }
  }

  function setBusy(busy) {
    $("send").disabled = busy;
    $("stop").disabled = !busy;
  }

  $("composer").addEventListener("submit", (ev) => {
    ev.preventDefault();
    const text = $("input").value.trim();
    if (!text || running) return;
    $("input").value = "";
    ask(text);
  });
  $("input").addEventListener("keydown", (ev) => {
    if (ev.key === "Enter" && !ev.shiftKey && !ev.isComposing) {
      ev.preventDefault();
      $("composer").requestSubmit();
    }
  });
  $("stop").addEventListener("click", () => { if (running) running.abort(); });
  $("clear").addEventListener("click", () => {
    if (running) running.abort();
    conversation.length = 0;
    log.replaceChildren();
  });

  // ---- the KV cache, from the Prometheus text of /metrics ----
  const history = [];  // [time, blocks in use], the last two minutes
  const HISTORY_MS = 120000;
  let pollTimer = null, polling = false;

  function parseMetrics(text) {
    const v = {};
    for (const line of text.split("\n")) {
      if (!line || line[0] === "#") continue;
      const sp = line.lastIndexOf(" ");
      v[line.slice(0, sp)] = Number(line.slice(sp + 1));
    }
    return v;
  }

  function showKv(v) {
    const total = v.tandem_kv_blocks_total || 0, used = v.tandem_kv_blocks_used || 0, cached = v.tandem_kv_blocks_cached || 0;
    const pct = (x) => (total ? (100 * x) / total : 0);
    $("kv-used").style.width = pct(used) + "%";
    $("kv-cached").style.width = pct(cached) + "%";
    $("kv-text").textContent =
      `${used} of ${total} blocks in use (${pct(used).toFixed(1)}%), ${cached} free blocks hold a cached prefix`;
    $("g-running").textContent = v.tandem_running_sequences ?? "–";
    $("g-waiting").textContent = v.tandem_queue_length ?? "–";
    $("g-tps").textContent = v.tandem_generation_tokens_per_second !== undefined ? v.tandem_generation_tokens_per_second.toFixed(1) : "–";
    $("g-hits").textContent = v.tandem_prefix_cache_hit_rate !== undefined ? (100 * v.tandem_prefix_cache_hit_rate).toFixed(1) + "%" : "–";
    const now = performance.now();
    history.push([now, used]);
    while (history.length && history[0][0] < now - HISTORY_MS) history.shift();
    drawHistory(now, total);
  }

  // Blocks in use over time. The scale follows the peak (a short answer holds a few blocks of a
  // pool of hundreds) and is written in the corner, so the picture never hides the numbers.
  function drawHistory(now, total) {
    const c = $("kv-history"), g = c.getContext("2d");
    const w = c.width, h = c.height;
    g.clearRect(0, 0, w, h);
    if (!total || !history.length) return;
    const peak = Math.max(...history.map(([, b]) => b));
    c.dataset.peak = peak;  // for scripts driving the page
    const top = Math.min(total, Math.max(4, Math.ceil(peak * 1.25)));
    const style = getComputedStyle(document.documentElement);
    // The time axis spans what was seen, 20 s at least and two minutes at most.
    const span = Math.min(HISTORY_MS, Math.max(20000, now - history[0][0]));
    const x = (t) => w - ((now - t) / span) * w;
    const y = (b) => h - 1 - (b / top) * (h - 16);
    g.beginPath();
    g.moveTo(x(history[0][0]), h);
    for (const [t, b] of history) g.lineTo(x(t), y(b));
    g.lineTo(x(now), y(history[history.length - 1][1]));
    g.lineTo(x(now), h);
    g.closePath();
    g.fillStyle = style.getPropertyValue("--cached").trim() || "#9bbcf2";
    g.fill();
    g.beginPath();
    history.forEach(([t, b], i) => (i ? g.lineTo(x(t), y(b)) : g.moveTo(x(t), y(b))));
    g.lineTo(x(now), y(history[history.length - 1][1]));
    g.strokeStyle = style.getPropertyValue("--used").trim() || "#2f6fde";
    g.lineWidth = 2;
    g.stroke();
    g.fillStyle = style.getPropertyValue("--muted").trim() || "#6b7385";
    g.font = "11px system-ui, sans-serif";
    g.fillText(`blocks in use, last ${Math.round(span / 1000)} s · scale 0-${top} · peak ${peak}`, 5, 11);
  }

  // One poll at a time: a call while one is under way leaves the next to it.
  async function pollKv() {
    clearTimeout(pollTimer);
    if (polling) return;
    polling = true;
    try {
      const r = await fetch("/metrics", { headers: headers(false), cache: "no-store" });
      if (r.status === 401) $("kv-text").textContent = "/metrics needs the API key (top right)";
      else if (!r.ok) $("kv-text").textContent = "/metrics: " + (await errorMessage(r));
      else showKv(parseMetrics(await r.text()));
    } catch (_) {
      $("kv-text").textContent = "server unreachable";
    } finally {
      polling = false;
    }
    // Faster while an answer streams, so the blocks it takes show as they fill.
    pollTimer = setTimeout(pollKv, running ? 250 : 1000);
  }

  loadModel();
  pollKv();
  $("input").focus();
})();
