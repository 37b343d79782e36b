/**
 * gpuspawner-monitor: live GPU statistics of this server in JupyterLab 4 and
 * Notebook 7: a status-bar item and a "GPU" panel (command "gpu:open-panel",
 * in the command palette and the launcher), and notices for the user (e.g. the
 * GPU idle culler's warning) as notifications and in the panel.
 */
import { ILabShell, ILayoutRestorer, JupyterFrontEnd, JupyterFrontEndPlugin } from '@jupyterlab/application';
import { ICommandPalette, WidgetTracker } from '@jupyterlab/apputils';
import { ILauncher } from '@jupyterlab/launcher';
import { IStatusBar } from '@jupyterlab/statusbar';

import { GPUStream } from './api';
import { NoticeFeed } from './notices';
import { GPUPanel } from './panel';
import { GPUStatusItem } from './statusbar';

const COMMAND = 'gpu:open-panel';

const plugin: JupyterFrontEndPlugin<void> = {
  id: 'gpuspawner-monitor:plugin',
  description: 'Live GPU statistics: status bar and GPU panel',
  autoStart: true,
  optional: [IStatusBar, ICommandPalette, ILauncher, ILayoutRestorer, ILabShell],
  activate: (
    app: JupyterFrontEnd,
    statusBar: IStatusBar | null,
    palette: ICommandPalette | null,
    launcher: ILauncher | null,
    restorer: ILayoutRestorer | null,
    labShell: ILabShell | null
  ) => {
    const stream = new GPUStream(app.serviceManager.serverSettings);
    stream.start();
    const notices = new NoticeFeed(app.serviceManager.serverSettings);
    notices.start();
    const tracker = new WidgetTracker<GPUPanel>({ namespace: 'gpuspawner-gpu' });
    let panel: GPUPanel | null = null;

    app.commands.addCommand(COMMAND, {
      label: 'GPU',
      caption: "Live statistics of this server's GPUs",
      execute: () => {
        if (!panel || panel.isDisposed) {
          panel = new GPUPanel(stream, notices);
          void tracker.add(panel);
        }
        if (!panel.isAttached) {
          // Notebook 7's shell keeps one document per page in 'main': there the panel is a side panel
          app.shell.add(panel, labShell ? 'main' : 'right', { rank: 1000 });
        }
        app.shell.activateById(panel.id);
      }
    });
    palette?.addItem({ command: COMMAND, category: 'GPU' });
    launcher?.add({ command: COMMAND, category: 'Other', rank: 1 });
    if (restorer) {
      void restorer.restore(tracker, { command: COMMAND, name: () => 'gpu-panel' });
    }
    const item = new GPUStatusItem(stream, () => void app.commands.execute(COMMAND));
    if (statusBar) {
      statusBar.registerStatusItem('gpuspawner-monitor:status', { item, align: 'left', rank: 5 });
    } else {
      // Notebook 7 has no status bar: the item goes in the top bar, on every page
      item.addClass('jp-gpuspawner-TopItem');
      app.shell.add(item, 'top', { rank: 900 });
    }
  }
};

export default plugin;
