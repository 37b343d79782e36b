/**
 * gpuspawner-monitor: live GPU statistics of this server in JupyterLab 4 and
 * Notebook 7: a status-bar item and a "GPU" panel (command "gpu:open-panel",
 * in the command palette and the launcher).
 */
import { ILayoutRestorer, JupyterFrontEnd, JupyterFrontEndPlugin } from '@jupyterlab/application';
import { ICommandPalette, WidgetTracker } from '@jupyterlab/apputils';
import { ILauncher } from '@jupyterlab/launcher';
import { IStatusBar } from '@jupyterlab/statusbar';

import { GPUStream } from './api';
import { GPUPanel } from './panel';
import { GPUStatusItem } from './statusbar';

const COMMAND = 'gpu:open-panel';

const plugin: JupyterFrontEndPlugin<void> = {
  id: 'gpuspawner-monitor:plugin',
  description: 'Live GPU statistics: status bar and GPU panel',
  autoStart: true,
  optional: [IStatusBar, ICommandPalette, ILauncher, ILayoutRestorer],
  activate: (
    app: JupyterFrontEnd,
    statusBar: IStatusBar | null,
    palette: ICommandPalette | null,
    launcher: ILauncher | null,
    restorer: ILayoutRestorer | null
  ) => {
    const stream = new GPUStream(app.serviceManager.serverSettings);
    stream.start();
    const tracker = new WidgetTracker<GPUPanel>({ namespace: 'gpuspawner-gpu' });
    let panel: GPUPanel | null = null;

    app.commands.addCommand(COMMAND, {
      label: 'GPU',
      caption: "Live statistics of this server's GPUs",
      execute: () => {
        if (!panel || panel.isDisposed) {
          panel = new GPUPanel(stream);
          void tracker.add(panel);
        }
        if (!panel.isAttached) {
          app.shell.add(panel, 'main');
        }
        app.shell.activateById(panel.id);
      }
    });
    palette?.addItem({ command: COMMAND, category: 'GPU' });
    launcher?.add({ command: COMMAND, category: 'Other', rank: 1 });
    if (restorer) {
      void restorer.restore(tracker, { command: COMMAND, name: () => 'gpu-panel' });
    }
    if (statusBar) {
      const item = new GPUStatusItem(stream, () => void app.commands.execute(COMMAND));
      statusBar.registerStatusItem('gpuspawner-monitor:status', { item, align: 'left', rank: 5 });
    }
  }
};

export default plugin;
