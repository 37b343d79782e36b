/*
 * Build the prebuilt JupyterLab extension into ../gpuspawner/labextension.
 *
 * Needs only node and node_modules: JupyterLab's core package description comes
 * from @jupyterlab/core-meta (npm) rather than from an installed jupyterlab, so
 * the wheel's build hook works in pip's isolated build environment too.
 */
'use strict';
const { execFileSync } = require('child_process');
const fs = require('fs');
const os = require('os');
const path = require('path');

const here = __dirname;
const core = fs.mkdtempSync(path.join(os.tmpdir(), 'gpuspawner-core-'));
try {
  fs.copyFileSync(require.resolve('@jupyterlab/core-meta/core.package.json'), path.join(core, 'package.json'));
  const run = (script, args) => execFileSync(process.execPath, [require.resolve(script), ...args], { cwd: here, stdio: 'inherit' });
  run('typescript/bin/tsc', ['-p', here]);
  run('@jupyterlab/builder/lib/build-labextension.js', ['--core-path', core, here]);
} finally {
  fs.rmSync(core, { recursive: true, force: true });
}
