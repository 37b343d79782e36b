/**
 * The monitor's API (gpuspawner/monitor/handlers.py): sample types and one
 * shared Server-Sent Events stream per browser tab.
 *
 * EventSource cannot send headers: it carries the server's cookie (JupyterHub
 * and a logged-in JupyterLab) and, when the page was opened with a token, the
 * token as a query parameter (and the _xsrf cookie, which JupyterHub requires).
 */
import { URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';
import { ISignal, Signal } from '@lumino/signaling';

export interface IKernelRef {
  id: string;
  name: string | null;
  path: string | null;
  pid: number;
  via_child: number | null;
}

export interface IProcess {
  pid: number;
  /** 'C' (compute), 'G' (graphics) or 'C+G' (both), as nvidia-smi shows it */
  type: string;
  used_memory: number | null;
  kernel: IKernelRef | null;
  note: string | null;
}

export interface IMig {
  uuid: string | null;
  name: string | null;
  cuda_index: number | null;
  memory_used: number | null;
  memory_reserved: number | null;
  memory_total: number | null;
  na: { [field: string]: string };
}

export interface IGPU {
  index: number;
  cuda_index: number | null;
  uuid: string | null;
  name: string | null;
  mig_mode: boolean | null;
  utilization_gpu: number | null;
  utilization_memory: number | null;
  /** allocated by processes (nvidia-smi's memory.used) */
  memory_used: number | null;
  /** kept by the driver for itself, not in memory_used */
  memory_reserved: number | null;
  memory_total: number | null;
  temperature: number | null;
  power: number | null;
  power_limit: number | null;
  clock_sm: number | null;
  clock_memory: number | null;
  clock_graphics: number | null;
  max_clock_sm: number | null;
  max_clock_memory: number | null;
  max_clock_graphics: number | null;
  /** link to each other GPU of this server, by index: NV<n>, PIX, PXB, PHB, NODE or SYS (nvidia-smi topo -m) */
  links: { [index: string]: string };
  numa_node: number | null;
  cpus: string | null;
  /** active NVLink links (0: none; nvlink_tx/rx are then null with no reason) */
  nvlink_links: number;
  /** bytes/s */
  pcie_tx: number | null;
  pcie_rx: number | null;
  nvlink_tx: number | null;
  nvlink_rx: number | null;
  processes: IProcess[];
  mig: IMig[];
  na: { [field: string]: string };
}

export interface ISample {
  time: number;
  status: string;
  detail: string | null;
  driver_version: string | null;
  cuda_driver_version: number | null;
  interval?: number;
  /** when the values beyond utilisation and memory were read; null: only utilisation was */
  detail_time?: number | null;
  gpus: IGPU[];
}

/** Seconds of history the panel shows and asks for when it connects. */
export const HISTORY_SECONDS = 600;

/** The page's _xsrf cookie, or null. */
function xsrfCookie(): string | null {
  const match = typeof document === 'undefined' ? null : document.cookie.match('\\b_xsrf=([^;]*)\\b');
  return match ? decodeURIComponent(match[1]) : null;
}

/**
 * The URL of an API path, with the token when the page has one, and the _xsrf cookie's value:
 * JupyterHub (4.1+) refuses cookie-authenticated requests that are not page loads unless they
 * carry it, and EventSource cannot send it as a header.
 */
export function apiUrl(settings: ServerConnection.ISettings, path: string, query: { [key: string]: string } = {}): string {
  const params = { ...query };
  if (settings.token) {
    params['token'] = settings.token;
  }
  const xsrf = xsrfCookie();
  if (xsrf) {
    params['_xsrf'] = xsrf;
  }
  return URLExt.join(settings.baseUrl, path) + URLExt.objectToQueryString(params);
}

/** One EventSource per tab, shared by the status bar and the panel. */
export class GPUStream {
  constructor(settings: ServerConnection.ISettings = ServerConnection.makeSettings()) {
    this._settings = settings;
  }

  /** A new sample arrived (also fired once after the history is loaded). */
  get changed(): ISignal<this, ISample> {
    return this._changed;
  }

  /** The kept samples, oldest first. */
  get history(): ReadonlyArray<ISample> {
    return this._history;
  }

  get latest(): ISample | null {
    return this._history.length ? this._history[this._history.length - 1] : null;
  }

  /** Why the stream is not connected, or null. */
  get problem(): string | null {
    return this._problem;
  }

  /**
   * Whether a GPU panel on screen is fed: the server then reads everything every sample (the status
   * bar alone needs utilisation and memory each second, the rest every GPUMonitor.detail_interval).
   * A change reconnects, asking only for the samples missed meanwhile.
   */
  setPanel(shown: boolean): void {
    if (shown === this._panel) {
      return;
    }
    this._panel = shown;
    if (this._source) {
      this.stop();
      this.start();
    }
  }

  start(): void {
    if (this._source) {
      return;
    }
    const since = this.latest ? Math.ceil(Date.now() / 1000 - this.latest.time + 1) : HISTORY_SECONDS;
    const query: { [key: string]: string } = { history: String(Math.min(since, HISTORY_SECONDS)) };
    if (this._panel) {
      query['view'] = 'panel';
    }
    const source = new EventSource(apiUrl(this._settings, 'api/gpus/stream', query), {
      withCredentials: true
    });
    source.addEventListener('history', (event: MessageEvent) => {
      const samples = JSON.parse(event.data) as ISample[];
      for (const sample of samples) {
        this._add(sample);
      }
    });
    source.addEventListener('sample', (event: MessageEvent) => {
      this._problem = null;
      const sample = JSON.parse(event.data) as ISample;
      this._add(sample);
      this._changed.emit(sample);
    });
    source.onerror = () => {
      // EventSource reconnects by itself (the server asks for 3 s); say so meanwhile.
      this._problem = 'connection to the GPU monitor lost; reconnecting';
      if (this.latest) {
        this._changed.emit(this.latest);
      }
    };
    this._source = source;
  }

  stop(): void {
    this._source?.close();
    this._source = null;
  }

  private _add(sample: ISample): void {
    const last = this.latest;
    if (last && sample.time <= last.time) {
      return;
    }
    this._history.push(sample);
    const oldest = sample.time - HISTORY_SECONDS;
    while (this._history.length && this._history[0].time < oldest) {
      this._history.shift();
    }
  }

  private _settings: ServerConnection.ISettings;
  private _source: EventSource | null = null;
  private _panel = false;
  private _history: ISample[] = [];
  private _problem: string | null = null;
  private _changed = new Signal<this, ISample>(this);
}

/** Bytes as GiB with one decimal. */
export function gib(bytes: number | null): string {
  return bytes === null ? 'N/A' : (bytes / 2 ** 30).toFixed(1);
}
