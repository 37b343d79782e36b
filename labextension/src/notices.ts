/**
 * Notices for this server's user (gpuspawner/monitor/notices.py), e.g. the GPU
 * idle culler's "this server will be stopped in 10 minutes because its GPUs
 * are idle". Polled from `api/gpus/notices`; each new notice becomes a
 * JupyterLab notification that stays until dismissed, and the GPU panel lists
 * the current ones.
 */
import { Notification } from '@jupyterlab/apputils';
import { URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';
import { ISignal, Signal } from '@lumino/signaling';

export interface INotice {
  id: string;
  level: 'info' | 'warning' | 'error';
  message: string;
  source: string;
  time: number;
}

/** Seconds between two polls of the notices. */
export const NOTICE_POLL_SECONDS = 5;

export class NoticeFeed {
  constructor(settings: ServerConnection.ISettings = ServerConnection.makeSettings()) {
    this._settings = settings;
  }

  get changed(): ISignal<this, ReadonlyArray<INotice>> {
    return this._changed;
  }

  get notices(): ReadonlyArray<INotice> {
    return this._notices;
  }

  start(): void {
    if (this._timer === null) {
      void this.poll();
      this._timer = window.setInterval(() => void this.poll(), NOTICE_POLL_SECONDS * 1000);
    }
  }

  stop(): void {
    if (this._timer !== null) {
      window.clearInterval(this._timer);
      this._timer = null;
    }
  }

  async poll(): Promise<void> {
    let notices: INotice[];
    try {
      const url = URLExt.join(this._settings.baseUrl, 'api/gpus/notices');
      const response = await ServerConnection.makeRequest(url, { cache: 'no-store' }, this._settings);
      if (!response.ok) {
        return;
      }
      notices = ((await response.json()) as { notices: INotice[] }).notices;
    } catch {
      return; // the server is going away or unreachable: keep what we have
    }
    for (const notice of notices) {
      const key = `${notice.id}@${notice.time}`;
      if (!this._shown.has(key)) {
        this._shown.add(key);
        Notification.emit(notice.message, notice.level, { autoClose: false });
      }
    }
    const before = JSON.stringify(this._notices);
    this._notices = notices;
    if (JSON.stringify(notices) !== before) {
      this._changed.emit(notices);
    }
  }

  private _settings: ServerConnection.ISettings;
  private _timer: number | null = null;
  private _notices: INotice[] = [];
  private _shown = new Set<string>();
  private _changed = new Signal<this, ReadonlyArray<INotice>>(this);
}
