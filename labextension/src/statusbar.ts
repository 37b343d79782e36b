/**
 * The status-bar item: "GPU 73% | 12.1 / 80.0 GiB", one line per GPU on hover.
 */
import { Widget } from '@lumino/widgets';

import { GPUStream, IGPU, ISample, gib } from './api';

function percent(value: number | null): string {
  return value === null ? 'N/A' : `${Math.round(value)}%`;
}

/** The short text for the status bar. */
export function summary(sample: ISample | null, problem: string | null): string {
  if (!sample) {
    return problem ? 'GPU: N/A' : 'GPU …';
  }
  if (sample.status !== 'ok' || sample.gpus.length === 0) {
    return 'GPU: N/A';
  }
  const gpus = sample.gpus;
  const utils = gpus.map(g => g.utilization_gpu).filter((v): v is number => v !== null);
  const util = utils.length ? utils.reduce((a, b) => a + b, 0) / utils.length : null;
  const used = gpus.every(g => g.memory_used !== null) ? gpus.reduce((a, g) => a + (g.memory_used as number), 0) : null;
  const total = gpus.every(g => g.memory_total !== null) ? gpus.reduce((a, g) => a + (g.memory_total as number), 0) : null;
  const label = gpus.length > 1 ? `${gpus.length} GPUs` : 'GPU';
  return `${label} ${percent(util)} | ${gib(used)} / ${gib(total)} GiB`;
}

function gpuLine(gpu: IGPU): string {
  const name = gpu.name ?? 'unknown GPU';
  if (gpu.uuid === null && gpu.na['memory_used']) {
    return `GPU ${gpu.index} ${name}: ${gpu.na['memory_used']}`;
  }
  const util = gpu.utilization_gpu === null ? `N/A (${gpu.na['utilization_gpu']})` : `${gpu.utilization_gpu}%`;
  const temp = gpu.temperature === null ? '' : `, ${gpu.temperature} °C`;
  const power = gpu.power === null ? '' : `, ${gpu.power.toFixed(0)} W`;
  return `GPU ${gpu.index} ${name}: ${util}, ${gib(gpu.memory_used)} / ${gib(gpu.memory_total)} GiB${temp}${power}`;
}

/** The hover text: one line per GPU, or why there is nothing to show. */
export function details(sample: ISample | null, problem: string | null): string {
  const lines: string[] = [];
  if (problem) {
    lines.push(problem);
  }
  if (sample) {
    if (sample.status !== 'ok') {
      lines.push(sample.status + (sample.detail ? `: ${sample.detail}` : ''));
    }
    lines.push(...sample.gpus.map(gpuLine));
  }
  lines.push('Click for the GPU panel.');
  return lines.join('\n');
}

export class GPUStatusItem extends Widget {
  constructor(stream: GPUStream, open: () => void) {
    super();
    this.addClass('jp-gpuspawner-StatusItem');
    this.node.setAttribute('data-gpuspawner', 'status');
    this.node.onclick = () => open();
    this._stream = stream;
    stream.changed.connect(this._render, this);
    this._render();
  }

  dispose(): void {
    this._stream.changed.disconnect(this._render, this);
    super.dispose();
  }

  private _render(): void {
    const sample = this._stream.latest;
    this.node.textContent = summary(sample, this._stream.problem);
    this.node.title = details(sample, this._stream.problem);
  }

  private _stream: GPUStream;
}
