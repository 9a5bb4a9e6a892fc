"""The page around the sections: inline CSS, the sortable table and token-view scripts, and the token data
(one self-contained file; nothing is fetched when it is opened)."""
from __future__ import annotations

import json
from html import escape
from typing import Any

from polar.report.data import ReportData
from polar.report.tokens import Decode, mask_runs, piece_table

CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,"DejaVu Sans",sans-serif;margin:0;background:#f4f5f7;color:#1d1f24}
main{max-width:1180px;margin:0 auto;padding:16px 20px 40px}
h1{font-size:22px;margin:8px 0 14px}h2{font-size:17px;margin:0 0 10px}
section{background:#fff;border:1px solid #dfe2e8;border-radius:8px;padding:14px 16px;margin:0 0 14px}
.grid{display:grid;grid-template-columns:repeat(auto-fit,minmax(520px,1fr));grid-auto-flow:dense;gap:14px}
.grid section{margin:0}.pair{display:flex;flex-wrap:wrap;gap:14px}.pair svg.plot{flex:1 1 460px;max-width:600px}.grid section#calls{grid-column:1/-1}
svg.plot{width:100%;max-width:640px;height:auto;display:block;margin:6px 0 10px}
svg text{font:11px system-ui,"DejaVu Sans",sans-serif;fill:#333}svg .ptitle{font-weight:600;font-size:12px}
svg .tick{fill:#666}svg .value{fill:#222}svg .grid{stroke:#e6e8ec}svg .mean{stroke:#c00;stroke-width:2}
table{border-collapse:collapse;font-size:13px;margin:4px 0 8px}
th,td{border-bottom:1px solid #eceef2;padding:3px 8px;text-align:left}td{white-space:nowrap}
.wide{overflow-x:auto}
th{background:#f7f8fa;font-weight:600}table.kv td:first-child{color:#555;width:160px}
table.kv thead{display:none}
table.sortable th{cursor:pointer;user-select:none}table.sortable th.asc::after{content:" ▲"}
table.sortable th.desc::after{content:" ▼"}#samples{overflow-x:auto}
.note{color:#555;font-style:italic;margin:4px 0}
footer{color:#777;font-size:12px;margin-top:10px}
#tv-controls{display:flex;gap:10px;align-items:center;flex-wrap:wrap;margin-bottom:8px}
#tv-controls select{max-width:640px;font-size:13px}
.legend span{display:inline-block;padding:0 6px;margin-right:6px;border-radius:3px}
.tv{font:12.5px/1.55 "DejaVu Sans Mono",ui-monospace,Menlo,Consolas,monospace;white-space:pre-wrap;word-break:break-word}
.run{border-left:4px solid #ccd;padding:2px 8px;margin:6px 0}.run.s{border-color:#4269d0}
.run h3{font:600 12px system-ui,sans-serif;margin:2px 0 4px;color:#444}
.t.m0{background:#eceef1;color:#555}.t.m1{color:#0b1a3a}
.prompt{max-height:260px;overflow:auto;background:#f7f8fa;color:#555;padding:6px 8px;border-radius:4px}
"""

SCRIPT = r"""
(function(){
function val(td){var v=td.getAttribute('data-v');if(v===null)v=td.textContent;var n=parseFloat(v);
  return (v!==''&&!isNaN(n)&&isFinite(v))?n:v.toLowerCase();}
document.querySelectorAll('table.sortable').forEach(function(t){
  t.querySelectorAll('th').forEach(function(th,i){th.addEventListener('click',function(){
    var asc=!th.classList.contains('asc');t.querySelectorAll('th').forEach(function(h){h.classList.remove('asc','desc')});
    th.classList.add(asc?'asc':'desc');var body=t.tBodies[0];var rows=Array.from(body.rows);
    rows.sort(function(a,b){var x=val(a.cells[i]),y=val(b.cells[i]);if(x===y)return 0;
      if(x===''||y==='')return x===''?1:-1;return (x<y?-1:1)*(asc?1:-1);});
    rows.forEach(function(r){body.appendChild(r)});});});});
var data=JSON.parse(document.getElementById('polar-data').textContent);
var sel=document.getElementById('tv-select'),view=document.getElementById('tv-body');
function piece(id){var p=data.pieces[id];return p===undefined?'\u27e8'+id+'\u27e9':p;}
function shade(lp){var a=0.18+0.72*(1-Math.min(-lp,10)/10);return 'rgba(66,105,208,'+a.toFixed(3)+')';}
function render(tid){
  var t=data.trajectories[tid];view.textContent='';if(!t){view.textContent='no such trajectory: '+tid;return;}
  var info=document.createElement('p');info.id='tv-info';
  info.textContent=t.label+' \u2014 prompt '+t.prompt_len+' tokens, response '+t.ids.length+' tokens: '+
    t.sampled+' sampled (loss_mask 1), '+(t.ids.length-t.sampled)+' context between calls (loss_mask 0)';
  view.appendChild(info);
  var d=document.createElement('details');var s=document.createElement('summary');
  s.textContent='prompt of the first call ('+t.prompt_len+' tokens, loss_mask 0: not part of the response)';
  var pre=document.createElement('div');pre.className='tv prompt';pre.textContent=data.prompts[t.prompt];
  d.appendChild(s);d.appendChild(pre);view.appendChild(d);
  t.runs.forEach(function(r,k){var div=document.createElement('div');div.className='run'+(r[2]?' s':'');
    var h=document.createElement('h3');
    h.textContent=r[2]?('sampled: call '+r[3]+', '+(r[1]-r[0])+' tokens (loss_mask 1, shaded by logprob)')
      :('context: '+(r[1]-r[0])+' tokens the engine read between calls (tool result, template; loss_mask 0)');
    div.appendChild(h);var tv=document.createElement('div');tv.className='tv';
    for(var i=r[0];i<r[1];i++){var sp=document.createElement('span');var id=t.ids[i];
      sp.className='t '+(r[2]?'m1':'m0');sp.textContent=piece(id);sp.setAttribute('data-i',i);
      if(r[2]){sp.style.background=shade(t.lp[i]);sp.title='#'+i+' id '+id+' logprob '+t.lp[i].toFixed(4);}
      else sp.title='#'+i+' id '+id+' (context)';
      tv.appendChild(sp);}
    div.appendChild(tv);view.appendChild(div);});
}
function fromHash(){var m=/traj=([^&]*)/.exec(location.hash);return m?decodeURIComponent(m[1]):null;}
function show(){var tid=fromHash()||sel.value;if(tid&&data.trajectories[tid]){sel.value=tid;render(tid);}
  else if(tid)render(tid);}
if(sel){sel.addEventListener('change',function(){location.hash='traj='+encodeURIComponent(sel.value);});
  window.addEventListener('hashchange',function(){show();document.getElementById('trajectory').scrollIntoView();});
  show();}
})();
"""


def token_payload(d: ReportData, decode: Decode | None, limit: int) -> dict[str, Any]:
    """The token view's data: decoded pieces of the used ids, distinct prompts, and per trajectory its
    response ids, logprobs and mask runs [start, end, sampled, call number]."""
    ids_order = [t for t in _ordered_ids(d) if t in d.tokens][:limit]
    prompts: dict[str, int] = {}
    used: set[int] = set()
    out: dict[str, Any] = {}
    for tid in ids_order:
        tok = d.tokens[tid]
        prompt = decode(tok["prompt_ids"]) if decode else " ".join(f"⟨{i}⟩" for i in tok["prompt_ids"])
        runs, call = [], 0
        for r in mask_runs(tok["loss_mask"]):
            call += r.sampled
            runs.append([r.start, r.end, int(r.sampled), call])
        used.update(tok["response_ids"])
        row = d.trajectories.loc[d.trajectories["trajectory_id"] == tid].iloc[0]
        out[tid] = {"label": f"{tid} ({row['harness']}, {row['status']}, reward {_reward(row['reward'])})",
                    "prompt": prompts.setdefault(prompt, len(prompts)), "prompt_len": len(tok["prompt_ids"]),
                    "ids": tok["response_ids"], "lp": [round(float(x), 4) for x in tok["logprobs"]],
                    "sampled": int(sum(tok["loss_mask"])), "runs": runs}
    return {"pieces": piece_table(sorted(used), decode) if decode else {}, "prompts": list(prompts),
            "trajectories": out}


def _reward(v: Any) -> str:
    return "none" if v is None or v != v else f"{float(v):g}"


def _ordered_ids(d: ReportData) -> list[str]:
    """Trajectories in sample-table order first, then the rest of the table."""
    first = [t for t in d.samples.get("trajectory_id", []) if isinstance(t, str)] if len(d.samples) else []
    return list(dict.fromkeys(first + list(d.trajectories["trajectory_id"])))


def token_section(payload: dict[str, Any], total: int, has_tokenizer: bool) -> str:
    trajs = payload["trajectories"]
    if not trajs:
        return '<section id="trajectory"><h2>Token view</h2><p class="note">No trajectories to show.</p></section>'
    options = "".join(f'<option value="{escape(t, quote=True)}">{escape(v["label"])}</option>'
                      for t, v in trajs.items())
    notes = []
    if total > len(trajs):
        notes.append(f"{len(trajs)} of {total} trajectories embedded (--max-token-views).")
    if not has_tokenizer:
        notes.append("No tokenizer found (pass --tokenizer MODEL_DIR): tokens are shown as ⟨id⟩.")
    legend = ('<span class="legend"><span style="background:rgba(66,105,208,.9);color:#fff">sampled, logprob 0</span>'
              '<span style="background:rgba(66,105,208,.18)">sampled, logprob ≤ -10</span>'
              '<span class="t m0">context (loss_mask 0)</span></span>')
    return (f'<section id="trajectory"><h2>Token view</h2><div id="tv-controls"><label>trajectory '
            f'<select id="tv-select">{options}</select></label>{legend}</div>'
            f'{"".join(f"<p class=note>{escape(n)}</p>" for n in notes)}<div id="tv-body"></div></section>')


def page(title: str, sections: list[str], payload: dict[str, Any], footer: str) -> str:
    blob = json.dumps(payload, ensure_ascii=False, separators=(",", ":")).replace("</", "<\\/")
    head, paired, rest = sections[0], sections[1:7], sections[7:]
    return (f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">'
            f'<meta http-equiv="Content-Security-Policy" content="default-src \'none\'; '
            f'style-src \'unsafe-inline\'; script-src \'unsafe-inline\'; img-src data:">'
            f'<title>{escape(title)}</title><style>{CSS}</style></head><body><main>'
            f'<h1>{escape(title)}</h1>{head}<div class="grid">{"".join(paired)}</div>{"".join(rest)}{footer}'
            f'</main><script type="application/json" id="polar-data">{blob}</script>'
            f'<script>{SCRIPT}</script></body></html>')
