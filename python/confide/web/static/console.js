// Confide console: live job pages (server-sent events + uPlot), the editor's hints, CSRF for htmx.
// No inline script anywhere (the Content-Security-Policy allows scripts from this origin only).
(function () {
  "use strict";
  const FINAL = ["completed", "failed", "cancelled", "refused", "revoked"];
  const palette = ["#0b5cad", "#b35900", "#116329", "#8250df", "#a40e26", "#1b7c83", "#57606a"];
  const csrf = document.querySelector('meta[name="csrf-token"]');
  document.addEventListener("htmx:configRequest", function (event) {
    if (csrf) event.detail.headers["X-CSRF-Token"] = csrf.content;
  });

  // ---------------------------------------------------------------- job page
  const job = document.getElementById("job");
  if (job) startJob(job);

  function startJob(root) {
    const token = root.dataset.session;
    const initial = JSON.parse(document.getElementById("initial-metrics").textContent);
    const rows = {};  // party -> {round -> row}
    initial.participants.forEach(function (p) { merge(p.name, p.metrics); });
    const charts = {
      loss: chart("chart-loss", ["loss"], false),
      quality: chart("chart-quality", ["auc", "accuracy"], false),
      bytes: chart("chart-bytes", ["bytes"], false),
      time: chart("chart-time", ["crypto_s", "train_s"], true),
    };
    redraw();
    drawLineage();
    showEvaluation(JSON.parse(document.getElementById("initial-evaluation").textContent));
    if (root.dataset.final === "true" || !window.EventSource) return;
    const source = new EventSource("/jobs/" + encodeURIComponent(token) + "/events");
    source.addEventListener("status", function (event) {
      const data = JSON.parse(event.data);
      if (data.reset) Object.keys(rows).forEach(function (name) { rows[name] = {}; });
      showStatus(data.status);
      data.metrics.forEach(function (p) { merge(p.name, p.metrics); });
      if (data.metrics.length || data.reset) redraw();
    });
    source.addEventListener("end", function () { source.close(); });
    source.addEventListener("problem", function () { source.close(); });

    function merge(name, list) {
      rows[name] = rows[name] || {};
      list.forEach(function (row) { rows[name][row.round] = row; });
    }

    function parties() {
      return Object.keys(rows).filter(function (n) { return Object.keys(rows[n]).length; }).sort();
    }

    function allRounds() {
      const seen = new Set();
      parties().forEach(function (n) { Object.keys(rows[n]).forEach(function (r) { seen.add(Number(r)); }); });
      return Array.from(seen).sort(function (a, b) { return a - b; });
    }

    function value(row, key) {
      if (!row) return null;
      if (key === "bytes") {
        // a round that did not count its bytes is a gap, not a zero
        if (typeof row.bytes_sent !== "number" && typeof row.bytes_received !== "number") return null;
        return (row.bytes_sent || 0) + (row.bytes_received || 0);
      }
      return typeof row[key] === "number" ? row[key] : null;
    }

    // One series per (party, key), plus the mean over parties ("all") for each key.
    function data(keys) {
      const rounds = allRounds();
      const series = [], labels = [];
      keys.forEach(function (key) {
        const perParty = parties().map(function (n) {
          return rounds.map(function (r) { return value(rows[n][r], key); });
        });
        const any = perParty.some(function (s) { return s.some(function (v) { return v !== null; }); });
        if (!any) return;
        perParty.forEach(function (s, i) { series.push(s); labels.push(parties()[i] + (keys.length > 1 ? " " + key : "")); });
        if (perParty.length > 1) {
          series.push(rounds.map(function (_, j) {
            const vals = perParty.map(function (s) { return s[j]; }).filter(function (v) { return v !== null; });
            return vals.length ? vals.reduce(function (a, b) { return a + b; }, 0) / vals.length : null;
          }));
          labels.push("all parties (mean)" + (keys.length > 1 ? " " + key : ""));
        }
      });
      return { rounds: rounds, series: series, labels: labels };
    }

    function chart(id, keys) {
      return { id: id, keys: keys, plot: null, signature: "" };
    }

    function redraw() {
      document.getElementById("rounds-seen").textContent = String(allRounds().length);
      if (!window.uPlot) return;
      Object.values(charts).forEach(function (c) {
        const d = data(c.keys);
        const element = document.getElementById(c.id);
        const signature = d.labels.join("|");
        const aligned = [d.rounds].concat(d.series);
        if (c.plot && c.signature === signature) { c.plot.setData(aligned); return; }
        if (c.plot) c.plot.destroy();
        element.textContent = d.series.length ? "" : (d.rounds.length ? "Not measured in this job's rounds." : "No rounds reported yet.");
        if (!d.series.length) { c.plot = null; return; }
        const width = Math.max(320, element.clientWidth || 560);
        c.plot = new window.uPlot({
          width: width, height: 220,
          scales: { x: { time: false } },
          legend: { live: false },
          axes: [{ label: "round", incrs: [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000] }, {}],
          series: [{ label: "round" }].concat(d.labels.map(function (label, i) {
            const mean = label.indexOf("all parties") === 0;
            return { label: label, stroke: mean ? "#1b1f24" : palette[i % palette.length], width: mean ? 2.5 : 1.5, spanGaps: true };
          })),
        }, aligned, element);
        c.signature = signature;
      });
    }

    function showStatus(status) {
      const state = document.getElementById("state");
      state.textContent = status.state;
      state.className = "state state-" + status.state;
      document.getElementById("run").textContent = String(status.run);
      const message = document.getElementById("message");
      message.textContent = status.message || "";
      message.hidden = !status.message;
      status.participants.forEach(function (p) {
        const row = document.querySelector('#participants tr[data-name="' + CSS.escape(p.name) + '"]');
        if (!row) return;
        row.querySelector(".status").textContent = p.status;
        row.querySelector(".run").textContent = String(p.run);
        row.querySelector(".round").textContent = String(p.round);
        row.querySelector(".error-text").textContent = p.error || "";
      });
      if (status.protection) showProtection(status.protection);
      if ("evaluation" in status) showEvaluation(status.evaluation);
      const stop = document.getElementById("stop-form");
      if (stop) stop.hidden = FINAL.indexOf(status.state) >= 0;
      const checkpoint = document.getElementById("checkpoint-round");
      if (checkpoint && status.checkpoint) checkpoint.textContent = String(status.checkpoint.round);
    }
  }

  // Datasets -> pipeline steps -> model, laid out left to right (cytoscape's breadthfirst layout).
  function drawLineage() {
    const box = document.getElementById("lineage");
    const source = document.getElementById("lineage-graph");
    if (!box || !source || !window.cytoscape) return;
    const graph = JSON.parse(source.textContent);
    if (!graph.nodes.length) { box.textContent = "This job does not provision data as FL_Data."; return; }
    const colors = { dataset: "#116329", step: "#0b5cad", model: "#8250df" };
    window.cytoscape({
      container: box,
      elements: graph.nodes.map(function (n) { return { data: n }; }).concat(
        graph.edges.map(function (e, i) { return { data: { id: "e" + i, source: e.source, target: e.target } }; })),
      style: [
        { selector: "node", style: { "label": "data(label)", "background-color": function (n) { return colors[n.data("kind")]; },
          "font-size": 13, "color": "#1b1f24", "text-valign": "center", "text-halign": "right", "text-margin-x": 6,
          "width": 16, "height": 16 } },
        { selector: "edge", style: { "width": 1.5, "line-color": "#8c959f", "target-arrow-color": "#8c959f",
          "target-arrow-shape": "triangle", "curve-style": "bezier" } },
      ],
      layout: { name: "breadthfirst", directed: true, padding: 24, spacingFactor: 1.0,
        roots: graph.nodes.filter(function (n) { return n.kind === "dataset"; }).map(function (n) { return "#" + n.id; }).join(", ") },
      userZoomingEnabled: false, userPanningEnabled: false, boxSelectionEnabled: false, autoungrabify: true,
    });
  }

  function element(tag, text, className) {
    const node = document.createElement(tag);
    if (text !== undefined) node.textContent = String(text);
    if (className) node.className = className;
    return node;
  }

  // The protection each party reports running, anomalies first (text only: never HTML).
  // Final held-out metrics as numbers: each completed party's, and their mean weighted by held-out rows.
  function showEvaluation(evaluation) {
    const box = document.getElementById("results");
    if (!box) return;
    box.textContent = "";
    if (!evaluation) {
      const none = document.createElement("p");
      none.className = "muted";
      none.textContent = "No party has completed with held-out metrics yet.";
      box.appendChild(none);
      return;
    }
    const table = document.createElement("table");
    table.id = "results-table";
    const caption = document.createElement("caption");
    caption.className = "visually-hidden";
    caption.textContent = "Final held-out metrics per party";
    table.appendChild(caption);
    const head = table.createTHead().insertRow();
    ["Party", "Test AUC", "Test accuracy", "Held-out rows"].forEach(function (text) {
      const th = document.createElement("th");
      th.scope = "col";
      th.textContent = text;
      head.appendChild(th);
    });
    const body = table.createTBody();
    function row(name, m) {
      const tr = body.insertRow();
      tr.dataset.name = name;
      [name, fixed(m.test_auc), fixed(m.test_accuracy), m.test_samples === undefined ? "" : String(m.test_samples)]
        .forEach(function (text) { tr.insertCell().textContent = text; });
    }
    Object.keys(evaluation.parties).sort().forEach(function (name) { row(name, evaluation.parties[name]); });
    if (evaluation.aggregate.parties > 1) row("all (weighted by held-out rows)", evaluation.aggregate);
    box.appendChild(table);
  }

  function fixed(value) {
    return typeof value === "number" ? value.toFixed(4) : "";
  }

  function showProtection(protection) {
    const box = document.getElementById("protection");
    if (!box) return;
    box.replaceChildren();
    protection.anomalies.forEach(function (a) {
      const p = element("p", a, "error");
      p.setAttribute("role", "alert");
      box.appendChild(p);
    });
    if (!protection.summary) {
      box.appendChild(element("p", "No party has reported its protection yet.", "muted"));
      return;
    }
    const list = element("dl", undefined, "facts");
    list.appendChild(element("dt", "Requested"));
    list.appendChild(element("dd", protection.requested));
    Object.keys(protection.summary).forEach(function (key) {
      list.appendChild(element("dt", key));
      list.appendChild(element("dd", protection.summary[key]));
    });
    box.appendChild(list);
    box.appendChild(element("p", "Reported by: " + Object.keys(protection.parties).join(", "), "muted"));
  }

  // ---------------------------------------------------------------- editor
  const spec = document.getElementById("spec");
  if (spec) startEditor(spec);

  function startEditor(area) {
    let editor = null;
    const upload = document.getElementById("upload");
    if (upload) upload.addEventListener("change", function () {
      const file = upload.files && upload.files[0];
      if (!file) return;
      file.text().then(function (text) {
        if (editor) { editor.set(text); return; }
        area.value = text;
        area.dispatchEvent(new Event("input", { bubbles: true }));
      });
    });
    let schema = null;
    fetch(area.dataset.schema, { credentials: "same-origin" }).then(function (r) { return r.json(); }).then(function (s) {
      schema = s;
      if (window.ConfideEditor) {
        editor = window.ConfideEditor.create(area, schema);
        const hints = document.getElementById("completion");
        if (hints) hints.textContent = "Ctrl-Space completes keys and values; hover a key for its documentation.";
        return;
      }
      hint();
    });
    ["keyup", "click"].forEach(function (name) { area.addEventListener(name, hint); });

    function resolve(node) {
      for (let i = 0; node && i < 8; i++) {
        if (node.$ref) { node = schema.$defs[node.$ref.split("/").pop()]; continue; }
        const options = node.anyOf || node.oneOf;
        if (options) {
          const objects = options.map(resolve).filter(function (o) { return o && o.properties; });
          if (!objects.length) return node;
          const merged = { properties: {} };
          objects.forEach(function (o) { Object.assign(merged.properties, o.properties); });
          return merged;
        }
        return node;
      }
      return node;
    }

    // The YAML path of the cursor's line, from indentation: enough to list the keys allowed there.
    function path() {
      const before = area.value.slice(0, area.selectionStart).split("\n");
      const current = before[before.length - 1];
      let indent = current.length - current.trimStart().length;
      const keys = [];
      for (let i = before.length - 2; i >= 0 && indent > 0; i--) {
        const line = before[i];
        const trimmed = line.trimStart();
        const own = line.length - trimmed.length;
        if (!trimmed || trimmed.startsWith("#") || own >= indent) continue;
        const match = /^-?\s*([A-Za-z_][\w-]*)\s*:/.exec(trimmed);
        if (match) keys.unshift(match[1]);
        indent = own;
      }
      return keys;
    }

    function hint() {
      const box = document.getElementById("completion");
      if (!schema || !box || editor) return;
      let node = resolve(schema);
      const keys = path();
      for (const key of keys) {
        node = node && node.properties ? resolve(node.properties[key]) : null;
        if (node && node.items) node = resolve(node.items);
        if (node && node.additionalProperties && !node.properties) node = resolve(node.additionalProperties);
      }
      if (!node || !node.properties) { box.textContent = ""; return; }
      const names = Object.keys(node.properties).map(function (k) {
        const p = resolve(node.properties[k]) || {};
        return k + (p.enum ? " (" + p.enum.join(" | ") + ")" : "");
      });
      box.textContent = "Keys allowed at " + (keys.length ? keys.join(".") : "the top") + ": " + names.join(", ");
    }
  }
})();
