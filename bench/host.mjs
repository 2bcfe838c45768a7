// The host's CPU as lscpu names it (model name, CPU family, model, stepping, caches), for the
// benchmark's output and JSON: "AMD EPYC" alone (os.cpus()) does not say which generation a
// cloud VM got. Falls back to /proc/cpuinfo, then to os.cpus(), where lscpu is missing.
import { execFileSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import os from 'node:os';

let cached = null;

export function hostCpu() {
  if (cached) return cached;
  const fields = {};
  let source = 'lscpu';
  try {
    const text = execFileSync('lscpu', { encoding: 'utf8', env: { ...process.env, LC_ALL: 'C' }, stdio: ['ignore', 'pipe', 'ignore'] });
    for (const line of text.split('\n')) {
      const m = /^([^:]+):\s*(.*)$/.exec(line);
      if (m) fields[m[1].trim()] = m[2].trim();
    }
  } catch {
    source = '/proc/cpuinfo';
    try {
      const text = readFileSync('/proc/cpuinfo', 'utf8').split('\n\n')[0];
      const names = { 'model name': 'Model name', 'cpu family': 'CPU family', model: 'Model', stepping: 'Stepping', vendor_id: 'Vendor ID' };
      for (const line of text.split('\n')) {
        const m = /^([^:]+?)\s*:\s*(.*)$/.exec(line);
        if (m && names[m[1]]) fields[names[m[1]]] = m[2].trim();
      }
    } catch {
      source = 'os.cpus()';
    }
  }
  cached = {
    source,
    modelName: fields['Model name'] ?? os.cpus()[0]?.model ?? 'unknown',
    vendor: fields['Vendor ID'] ?? null,
    cpuFamily: fields['CPU family'] ?? null,
    model: fields.Model ?? null,
    stepping: fields.Stepping ?? null,
    hypervisor: fields['Hypervisor vendor'] ?? null,
    cpus: fields['CPU(s)'] ?? String(os.cpus().length),
    l2: fields['L2 cache'] ?? null,
    l3: fields['L3 cache'] ?? null,
  };
  return cached;
}

/** `AMD EPYC (lscpu: CPU family 25, model 17, stepping 1; L2 2 MiB (2 instances), L3 32 MiB (1 instance); KVM)` */
export function describeHostCpu(h = hostCpu()) {
  const id = [h.cpuFamily !== null && `CPU family ${h.cpuFamily}`, h.model !== null && `model ${h.model}`, h.stepping !== null && `stepping ${h.stepping}`]
    .filter(Boolean).join(', ');
  const caches = [h.l2 && `L2 ${h.l2}`, h.l3 && `L3 ${h.l3}`].filter(Boolean).join(', ');
  return `${h.modelName} (${h.source}: ${id || 'family/model unknown'}${caches ? `; ${caches}` : ''}${h.hypervisor ? `; ${h.hypervisor}` : ''})`;
}

/** Bytes of the last-level cache from lscpu's "32 MiB (1 instance)", or null. */
export function l3Bytes(h) {
  const m = /([\d.]+)\s*(KiB|MiB|GiB|K|M|G)/.exec(h.l3 ?? '');
  if (!m) return null;
  return Number(m[1]) * 2 ** ({ K: 10, KiB: 10, M: 20, MiB: 20, G: 30, GiB: 30 }[m[2]]);
}
