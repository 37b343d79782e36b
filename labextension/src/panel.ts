/**
 * The GPU panel: the links between this server's GPUs (like nvidia-smi topo -m);
 * per GPU, live charts of utilisation, memory, temperature, power and PCIe /
 * NVLink throughput over the last minutes, clocks, processes (with their
 * notebooks) and MIG instances. A value that is not available says N/A and why.
 */
import { Widget } from '@lumino/widgets';
import uPlot from 'uplot';

import { GPUStream, IGPU, IMig, ISample, gib } from './api';
import { NoticeFeed } from './notices';

interface IChartSpec {
  key: string;
  title: string;
  unit: string;
  value: (gpu: IGPU) => number | null;
  max: (gpu: IGPU) => number | null;
  naField: string;
  /** the label's text when the value is there (default: value / max unit) */
  label?: (gpu: IGPU) => string;
  /** whether the chart applies to this GPU (default: always) */
  applies?: (gpu: IGPU) => boolean;
}

/** Bytes/s as MB/s. */
function mbps(value: number | null): string {
  return value === null ? 'N/A' : (value / 1e6).toFixed(1);
}

function sum(a: number | null, b: number | null): number | null {
  return a === null || b === null ? null : (a + b) / 1e6;
}

const CHARTS: IChartSpec[] = [
  { key: 'util', title: 'Utilisation', unit: '%', value: g => g.utilization_gpu, max: () => 100, naField: 'utilization_gpu' },
  {
    key: 'memory',
    title: 'Memory',
    unit: 'GiB',
    value: g => (g.memory_used === null ? null : g.memory_used / 2 ** 30),
    max: g => (g.memory_total === null ? null : g.memory_total / 2 ** 30),
    naField: 'memory_used'
  },
  { key: 'temperature', title: 'Temperature', unit: '°C', value: g => g.temperature, max: () => null, naField: 'temperature' },
  { key: 'power', title: 'Power', unit: 'W', value: g => g.power, max: g => g.power_limit, naField: 'power' },
  {
    key: 'pcie',
    title: 'PCIe',
    unit: 'MB/s',
    value: g => sum(g.pcie_tx, g.pcie_rx),
    max: () => null,
    naField: 'pcie_tx',
    label: g => `PCIe: tx ${mbps(g.pcie_tx)} · rx ${mbps(g.pcie_rx)} MB/s`
  },
  {
    key: 'nvlink',
    title: 'NVLink',
    unit: 'MB/s',
    value: g => sum(g.nvlink_tx, g.nvlink_rx),
    max: () => null,
    naField: 'nvlink_tx',
    label: g => `NVLink (${g.nvlink_links} links): tx ${mbps(g.nvlink_tx)} · rx ${mbps(g.nvlink_rx)} MB/s`,
    applies: g => g.nvlink_links > 0
  }
];

/** A theme colour (canvas cannot read CSS variables itself). */
function cssVar(name: string, fallback: string): string {
  return getComputedStyle(document.body).getPropertyValue(name).trim() || fallback;
}

/** Memory as nvidia-smi splits it: used by processes, reserved by the driver, total. */
function memoryTooltip(d: IGPU | IMig): string {
  const used = d.memory_used === null ? na(d, 'memory_used') : `${gib(d.memory_used)} GiB`;
  const reserved = d.memory_reserved === null ? na(d, 'memory_reserved') : `${gib(d.memory_reserved)} GiB`;
  const total = d.memory_total === null ? na(d, 'memory_total') : `${gib(d.memory_total)} GiB`;
  return `Used by processes: ${used}\nReserved by the driver: ${reserved}\nTotal: ${total}`;
}

function gpuKey(gpu: IGPU): string {
  return `${gpu.index}:${gpu.uuid ?? ''}`;
}

function el<K extends keyof HTMLElementTagNameMap>(tag: K, cls?: string, text?: string): HTMLElementTagNameMap[K] {
  const node = document.createElement(tag);
  if (cls) {
    node.className = cls;
  }
  if (text !== undefined) {
    node.textContent = text;
  }
  return node;
}

function na(gpu: { na: { [field: string]: string } }, field: string): string {
  return `N/A (${gpu.na[field] ?? 'not reported'})`;
}

class GPUCard {
  constructor(gpu: IGPU) {
    this.node = el('section', 'jp-gpuspawner-Card');
    this.node.dataset.gpuIndex = String(gpu.index);
    this._title = el('h3', 'jp-gpuspawner-CardTitle');
    this.node.appendChild(this._title);
    const charts = el('div', 'jp-gpuspawner-Charts');
    for (const spec of CHARTS) {
      const box = el('div', 'jp-gpuspawner-Chart');
      box.dataset.chart = spec.key;
      this._boxes[spec.key] = box;
      const label = el('div', 'jp-gpuspawner-ChartLabel');
      label.dataset.field = spec.key;
      box.appendChild(label);
      const plotNode = el('div', 'jp-gpuspawner-Plot');
      box.appendChild(plotNode);
      charts.appendChild(box);
      this._labels[spec.key] = label;
      const ink = cssVar('--jp-ui-font-color2', '#616161');
      const grid = cssVar('--jp-border-color2', '#e0e0e0');
      const line = cssVar('--jp-brand-color1', '#1976d2');
      this._plots[spec.key] = new uPlot(
        {
          width: 260,
          height: 110,
          legend: { show: false },
          cursor: { show: false },
          scales: { x: { time: true }, y: { range: (_u, lo, hi) => [Math.min(0, lo ?? 0), Math.max(hi ?? 1, spec.max(gpu) ?? 0, 1)] } },
          axes: [
            { size: 30, stroke: ink, grid: { stroke: grid, width: 1 }, ticks: { stroke: grid } },
            { size: 44, stroke: ink, grid: { stroke: grid, width: 1 }, ticks: { stroke: grid } }
          ],
          series: [{}, { label: spec.title, stroke: line, fill: line + '26', width: 1.5, spanGaps: false, points: { show: false } }]
        },
        [[], []],
        plotNode
      );
    }
    this.node.appendChild(charts);
    this._clocks = el('div', 'jp-gpuspawner-Clocks');
    this._clocks.dataset.field = 'clocks';
    this.node.appendChild(this._clocks);
    this._processes = el('div', 'jp-gpuspawner-Processes');
    this.node.appendChild(this._processes);
    this._mig = el('div', 'jp-gpuspawner-Mig');
    this.node.appendChild(this._mig);
  }

  update(gpu: IGPU, history: ReadonlyArray<ISample>): void {
    const cuda = gpu.cuda_index === null ? '' : ` (cuda:${gpu.cuda_index})`;
    this._title.textContent = `GPU ${gpu.index}${cuda} · ${gpu.name ?? na(gpu, 'name')}`;
    this._title.title = gpu.uuid ?? '';
    const key = gpuKey(gpu);
    for (const spec of CHARTS) {
      const applies = spec.applies ? spec.applies(gpu) : true;
      this._boxes[spec.key].hidden = !applies;
      if (!applies) {
        continue;
      }
      const value = spec.value(gpu);
      const max = spec.max(gpu);
      const digits = spec.key === 'memory' ? 1 : 0;
      this._labels[spec.key].textContent =
        value === null
          ? `${spec.title}: ${na(gpu, spec.naField)}`
          : spec.label
            ? spec.label(gpu)
            : `${spec.title}: ${value.toFixed(digits)}${max !== null ? ` / ${max.toFixed(digits)}` : ''} ${spec.unit}`;
      const times: number[] = [];
      const values: (number | null)[] = [];
      for (const sample of history) {
        const g = sample.gpus.find(x => gpuKey(x) === key);
        times.push(sample.time);
        values.push(g ? spec.value(g) : null);
      }
      this._plots[spec.key].setData([times, values] as uPlot.AlignedData);
    }
    const clocks = (['sm', 'memory', 'graphics'] as const).map(c => {
      const value = gpu[`clock_${c}`];
      const max = gpu[`max_clock_${c}`];
      return `${c} ${value === null ? na(gpu, `clock_${c}`) : `${value}${max === null ? '' : ` / ${max}`} MHz`}`;
    });
    this._clocks.textContent = `Clocks: ${clocks.join(' · ')}`;
    this._labels['memory'].title = memoryTooltip(gpu);
    this._renderProcesses(gpu);
    this._renderMig(gpu);
  }

  dispose(): void {
    for (const plot of Object.values(this._plots)) {
      plot.destroy();
    }
    this.node.remove();
  }

  private _renderProcesses(gpu: IGPU): void {
    const box = this._processes;
    box.textContent = '';
    box.appendChild(el('h4', undefined, 'Processes'));
    if (gpu.na['processes']) {
      box.appendChild(el('p', 'jp-gpuspawner-NA', na(gpu, 'processes')));
      return;
    }
    if (!gpu.processes.length) {
      box.appendChild(el('p', 'jp-gpuspawner-Empty', 'No process is using this GPU.'));
      return;
    }
    const table = el('table', 'jp-gpuspawner-Table');
    const head = table.insertRow();
    for (const h of ['PID', 'Type', 'Memory', 'Notebook / kernel']) {
      head.appendChild(el('th', undefined, h));
    }
    for (const p of gpu.processes) {
      const row = table.insertRow();
      row.insertCell().textContent = String(p.pid);
      row.insertCell().textContent = p.type;
      row.insertCell().textContent = p.used_memory === null ? 'N/A' : `${gib(p.used_memory)} GiB`;
      const k = p.kernel;
      row.insertCell().textContent = k
        ? `${k.path ?? '(no notebook)'} · ${k.name ?? 'kernel'} ${k.id.slice(0, 8)}${k.via_child ? ' (child process)' : ''}`
        : p.note ?? '';
    }
    box.appendChild(table);
  }

  private _renderMig(gpu: IGPU): void {
    const box = this._mig;
    box.textContent = '';
    if (!gpu.mig.length) {
      return;
    }
    box.appendChild(el('h4', undefined, 'MIG instances'));
    const table = el('table', 'jp-gpuspawner-Table');
    for (const m of gpu.mig) {
      const row = table.insertRow();
      row.insertCell().textContent = m.name ?? m.uuid ?? 'MIG device';
      row.insertCell().textContent =
        m.memory_used === null ? na(m, 'memory_used') : `${gib(m.memory_used)} / ${gib(m.memory_total)} GiB`;
      row.title = [m.uuid ?? '', memoryTooltip(m)].join('\n');
    }
    box.appendChild(table);
  }

  readonly node: HTMLElement;
  private _title: HTMLElement;
  private _labels: { [key: string]: HTMLElement } = {};
  private _boxes: { [key: string]: HTMLElement } = {};
  private _plots: { [key: string]: uPlot } = {};
  private _clocks: HTMLElement;
  private _processes: HTMLElement;
  private _mig: HTMLElement;
}

const LINK_WORDS: { [word: string]: string } = {
  PIX: 'at most one PCIe switch',
  PXB: 'several PCIe switches, no host bridge',
  PHB: 'one PCIe host bridge',
  NODE: 'one NUMA node, different host bridges',
  SYS: 'across CPU sockets'
};

function linkTitle(word: string): string {
  const nv = /^NV(\d+)$/.exec(word);
  return nv ? `NVLink, ${nv[1]} link${nv[1] === '1' ? '' : 's'}` : LINK_WORDS[word] ?? 'not known';
}

/** The link matrix of the server's GPUs, with each GPU's CPUs and NUMA node, as nvidia-smi topo -m. */
function renderTopology(box: HTMLElement, gpus: IGPU[]): void {
  box.replaceChildren();
  if (!gpus.length) {
    return;
  }
  box.appendChild(el('h4', undefined, 'Topology'));
  const table = el('table', 'jp-gpuspawner-Table jp-gpuspawner-Topology');
  const head = table.insertRow();
  head.appendChild(el('th'));
  for (const g of gpus) {
    head.appendChild(el('th', undefined, `GPU${g.index}`));
  }
  head.appendChild(el('th', undefined, 'CPU affinity'));
  head.appendChild(el('th', undefined, 'NUMA node'));
  for (const row of gpus) {
    const tr = table.insertRow();
    tr.dataset.gpuIndex = String(row.index);
    tr.appendChild(el('th', undefined, `GPU${row.index}`));
    for (const col of gpus) {
      const word = col.index === row.index ? 'X' : row.links[String(col.index)] ?? 'N/A';
      const cell = tr.insertCell();
      cell.textContent = word;
      cell.title = col.index === row.index ? '' : linkTitle(word);
      cell.dataset.link = word;
    }
    tr.insertCell().textContent = row.cpus ?? 'N/A';
    tr.insertCell().textContent = row.numa_node === null ? 'N/A' : String(row.numa_node);
  }
  box.appendChild(table);
}

export class GPUPanel extends Widget {
  constructor(stream: GPUStream, notices: NoticeFeed | null = null) {
    super();
    this.id = 'gpuspawner-gpu-panel';
    this.title.label = 'GPU';
    this.title.caption = 'Live statistics of this server\'s GPUs';
    this.title.closable = true;
    this.addClass('jp-gpuspawner-Panel');
    this._status = el('div', 'jp-gpuspawner-Status');
    this._status.dataset.gpuspawner = 'panel-status';
    this._cards = el('div', 'jp-gpuspawner-Cards');
    this._topology = el('div', 'jp-gpuspawner-TopologyBox');
    this._topology.dataset.gpuspawner = 'topology';
    this._notices = el('div', 'jp-gpuspawner-Notices');
    this._notices.dataset.gpuspawner = 'notices';
    this.node.appendChild(this._notices);
    this.node.appendChild(this._status);
    this.node.appendChild(this._topology);
    this.node.appendChild(this._cards);
    this._stream = stream;
    stream.changed.connect(this._render, this);
    this._feed = notices;
    notices?.changed.connect(this._renderNotices, this);
    this._renderNotices();
    this._render();
  }

  dispose(): void {
    this._stream.setPanel(false);
    this._stream.changed.disconnect(this._render, this);
    this._feed?.changed.disconnect(this._renderNotices, this);
    for (const card of this._byKey.values()) {
      card.dispose();
    }
    super.dispose();
  }

  private _render(): void {
    const sample = this._stream.latest;
    const problem = this._stream.problem;
    if (!sample) {
      this._status.textContent = problem ?? 'Waiting for the first GPU sample…';
      return;
    }
    const head = [] as string[];
    if (problem) {
      head.push(problem);
    }
    if (sample.status !== 'ok') {
      head.push(sample.status + (sample.detail ? `. ${sample.detail}` : ''));
    } else {
      head.push(
        `${sample.gpus.length} GPU${sample.gpus.length === 1 ? '' : 's'} · driver ${sample.driver_version ?? 'N/A'} · ` +
          `updated ${new Date(sample.time * 1000).toLocaleTimeString()}`
      );
    }
    this._status.textContent = head.join(' — ');
    this._status.classList.toggle('jp-gpuspawner-Problem', sample.status !== 'ok' || problem !== null);
    const links = JSON.stringify(sample.gpus.map(g => [g.index, g.links, g.cpus, g.numa_node]));
    if (links !== this._linksShown) {  // the matrix changes only when the GPUs do
      this._linksShown = links;
      renderTopology(this._topology, sample.gpus);
    }
    const seen = new Set<string>();
    for (const gpu of sample.gpus) {
      const key = gpuKey(gpu);
      seen.add(key);
      let card = this._byKey.get(key);
      const created = !card;
      if (!card) {
        card = new GPUCard(gpu);
        this._byKey.set(key, card);
        this._cards.appendChild(card.node);
      }
      if (created || this.isVisible) {  // hidden: catch up in onAfterShow
        card.update(gpu, this._stream.history);
      }
    }
    for (const [key, card] of this._byKey) {
      if (!seen.has(key)) {
        card.dispose();
        this._byKey.delete(key);
      }
    }
  }

  private _renderNotices(): void {
    this._notices.replaceChildren();
    for (const notice of this._feed?.notices ?? []) {
      const item = el('div', `jp-gpuspawner-Notice jp-gpuspawner-Notice-${notice.level}`, notice.message);
      item.dataset.noticeId = notice.id;
      item.title = `${notice.source || 'notice'}, ${new Date(notice.time * 1000).toLocaleTimeString()}`;
      this._notices.appendChild(item);
    }
  }

  protected onAfterShow(): void {
    this._stream.setPanel(true);
    this._render();
  }

  protected onAfterAttach(): void {
    this._stream.setPanel(this.isVisible);
  }

  protected onBeforeHide(): void {
    this._stream.setPanel(false);
  }

  protected onBeforeDetach(): void {
    this._stream.setPanel(false);
  }

  private _stream: GPUStream;
  private _feed: NoticeFeed | null;
  private _notices: HTMLElement;
  private _status: HTMLElement;
  private _cards: HTMLElement;
  private _topology: HTMLElement;
  private _linksShown = '';
  private _byKey = new Map<string, GPUCard>();
}
