const atlas = (() => {
  const D = JSON.parse(document.getElementById('atlas-data').textContent);
  const $ = (id) => document.getElementById(id);
  const draw = (div, fig) => Plotly.react(div, fig.data, {...fig.layout, template: D.template});
  const fmt = (v) => (v === null || v === undefined) ? 'n/a' : Number(v).toFixed(4);
  function current() { return {model: $('model').value, stat: $('stat').value, view: $('view').value}; }
  // the grid's z and intervals (rows: layers) from the per-head numbers [value, lo, hi, rank] of a variant
  function grid(rows, nHeads, pick) {
    const out = [];
    for (let i = 0; i < rows.length; i += nHeads) out.push(rows.slice(i, i + nHeads).map(pick));
    return out;
  }
  function recolour() {
    const c = current();
    const label = D.stat_labels[c.stat];
    for (const m of D.models) {
      const n = D.n_heads[m], nums = D.heads[m];
      const side = D.variants[m];
      const controls = side.includes('trained') ? side.filter((v) => v !== 'trained') : [];
      const pairs = (v) => nums.trained[c.stat].map((t, i) => [t[0], nums[v][c.stat][i][0]]);
      const hover = '<br>layer %{y}, head %{x}<br>%{z:.4f} [%{customdata[0]:.4f}, %{customdata[1]:.4f}]<extra></extra>';
      const updates = {
        side: [{
          z: side.map((v) => grid(nums[v][c.stat], n, (r) => r[0])),
          customdata: side.map((v) => grid(nums[v][c.stat], n, (r) => [r[1], r[2]])),
          hovertemplate: side.map((v) => `${m} ${v}: ${label}` + hover),
        }, {'coloraxis.colorbar.title.text': label}],
        // trained minus each control; hover: the two values
        diff: [{
          z: controls.map((v) => grid(pairs(v), n, ([a, b]) => (a === null || b === null) ? null : a - b)),
          customdata: controls.map((v) => grid(pairs(v), n, (pair) => pair)),
          hovertemplate: controls.map((v) => `${m} trained - ${v}: ${label}<br>layer %{y}, head %{x}<br>` +
            '%{z:.4f} (trained %{customdata[0]:.4f}, control %{customdata[1]:.4f})<extra></extra>'),
        }, {'coloraxis.colorbar.title.text': `trained - control: ${label}`}],
      };
      for (const view of ['side', 'diff']) {
        const div = $(`grid-${m}-${view}`);
        if (!div) continue;
        const shown = m === c.model && view === c.view;
        div.style.display = shown ? '' : 'none';
        Plotly.update(div, updates[view][0], updates[view][1]);
        if (shown) Plotly.Plots.resize(div);
      }
    }
  }
  function showHead(model, variant, layer, head) {
    const nHeads = D.n_heads[model];
    const i = layer * nHeads + head;
    const nums = D.heads[model][variant];
    const total = nums[D.stat_keys[0]].length;
    let rows = '';
    for (const key of D.stat_keys) {
      const [v, lo, hi, rank] = nums[key][i];
      const interval = (lo === null) ? '' : ` [${fmt(lo)}, ${fmt(hi)}]`;
      const ranked = (rank === null) ? '' : `${rank} of ${total}`;
      rows += `<tr data-stat="${key}"><td>${D.stat_labels[key]}</td><td class="value">${fmt(v)}</td>` +
              `<td>${interval}</td><td class="rank">${ranked}</td></tr>`;
    }
    $('detail-title').textContent = `${model} ${variant}, layer ${layer}, head ${head}`;
    $('detail-title').dataset.head = `${model}|${variant}|${layer}|${head}`;
    $('detail-numbers').innerHTML = '<tr><th>statistic</th><th>value</th><th>95 % interval over windows</th>' +
                                    '<th>rank (1 = highest)</th></tr>' + rows;
    const sweep = structuredClone(D.templates.sweep);
    sweep.data[0].y = D.sweep[model][variant][i];
    draw('detail-sweep', sweep);
    const bands = structuredClone(D.templates.bands);
    const prof = D.bands[model] && D.bands[model][variant];
    if (prof) {
      bands.data[0].x = prof.theta[layer]; bands.data[0].y = prof.q[i];
      const kvHeads = nHeads / prof.group;
      bands.data[1].x = prof.theta[layer]; bands.data[1].y = prof.k[layer * kvHeads + Math.floor(head / prof.group)];
    }
    draw('detail-bands', bands);
    const map = D.maps[`${model}|${variant}|${layer}|${head}`];
    if (map) {
      $('detail-maps-note').textContent = '';
      $('detail-maps').style.display = '';
      draw('detail-maps', map);
    } else {
      $('detail-maps').style.display = 'none';
      $('detail-maps-note').innerHTML = 'Logit maps are kept for the example heads only (examples.nc): ' +
        D.example_heads.filter((k) => k.startsWith(model + '|' + variant + '|')).map((k) => {
          const p = k.split('|');
          return `<a href="#detail" data-head="${k}">layer ${p[2]} head ${p[3]}</a>`;
        }).join(', ') + '.';
    }
  }
  function showHeads(model, stat) {
    $('model').value = model; $('stat').value = stat; recolour();
  }
  function showClassifier(key) {
    $('classifier').value = key;
    draw('classifier-fig', D.classifier_figures[key]);
    const rows = D.classifier_verdicts[key] || [];
    $('classifier-verdicts').innerHTML = rows.length ? 'Verdicts decided on it: ' +
      rows.map(([id, claim]) => `<a href="#${id}">${claim}</a>`).join('; ') : 'No verdict row names it.';
  }
  document.addEventListener('DOMContentLoaded', () => {
    for (const id of ['model', 'stat', 'view']) $(id).addEventListener('change', recolour);
    $('classifier').addEventListener('change', () => showClassifier($('classifier').value));
    // the maps note's links to the example heads: data-head="model|variant|layer|head"
    $('detail-maps-note').addEventListener('click', (ev) => {
      const link = ev.target.closest('a[data-head]');
      if (!link) return;
      const [model, variant, layer, head] = link.dataset.head.split('|');
      showHead(model, variant, Number(layer), Number(head));
    });
    // the verdict rows' links to what each was decided on: data-heads="model|statistic", data-classifier="key"
    $('verdict-tables').addEventListener('click', (ev) => {
      const heads = ev.target.closest('a[data-heads]'), classifier = ev.target.closest('a[data-classifier]');
      if (heads) showHeads(...heads.dataset.heads.split('|'));
      if (classifier) showClassifier(classifier.dataset.classifier);
    });
    for (const m of D.models) {
      for (const view of ['side', 'diff']) {
        const div = $(`grid-${m}-${view}`);
        if (!div) continue;
        div.on('plotly_click', (ev) => {
          const pt = ev.points[0];
          const variant = view === 'side' ? D.variants[m][pt.curveNumber] : 'trained';
          showHead(m, variant, pt.y, pt.x);
          $('detail').scrollIntoView();
        });
      }
    }
    recolour();
    if (D.classifiers.length) showClassifier(D.classifiers[0].key);
    showHead(D.models[0], D.variants[D.models[0]][0], 0, 0);
    document.body.dataset.ready = '1';
  });
  return {showHead, showHeads, showClassifier, recolour, data: D};
})();
