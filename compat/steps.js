// Step runner and bounded polling shared by the Node.js compatibility scenarios. A scenario
// is a list of async functions run in order; the first failure prints the step's name and
// the reason, and the process exits with 1.
'use strict';

const STEP_WAIT_MS = 20000;

class StepFailed extends Error {}

function check(cond, msg) {
  if (!cond) throw new StepFailed(msg);
}

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

// Calls probe() until it resolves; its value is returned. After `timeoutMs` the last
// reason fails the step.
async function poll(what, probe, timeoutMs = STEP_WAIT_MS, intervalMs = 250) {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    let last;
    try {
      return await probe();
    } catch (e) {
      last = e instanceof StepFailed ? e.message : `${e && e.name}: ${e && e.message}`;
    }
    if (Date.now() > deadline) {
      throw new StepFailed(`not within ${timeoutMs / 1000} s: ${what} (last: ${last})`);
    }
    await sleep(intervalMs);
  }
}

// host:port of a DC from the environment (TANDEM_A, TANDEM_B).
function addr(name) {
  const value = (process.env[name] || '').trim().replace('http://', '').replace(/\/$/, '');
  if (!value) {
    console.error(`${name} is not set (host:port of a tandem node's HTTP API)`);
    process.exit(2);
  }
  return value;
}

function hostPort(address) {
  const i = address.lastIndexOf(':');
  return { host: address.slice(0, i), port: Number(address.slice(i + 1)) };
}

// Runs the steps in order, one line each; at the first failure runs `cleanup` (bounded)
// and exits 1. Exits 0 at the end (a client's timers may otherwise keep the process alive).
async function run(title, steps, cleanup) {
  const started = Date.now();
  console.log(`${title}: ${steps.length} steps`);
  let failed = false;
  for (const fn of steps) {
    const t0 = Date.now();
    try {
      await fn();
    } catch (e) {
      if (!(e instanceof StepFailed)) console.log(e && e.stack);
      console.log(`FAILED step ${fn.name}: ${e && e.message}`);
      failed = true;
      break;
    }
    console.log(`ok   ${fn.name} (${((Date.now() - t0) / 1000).toFixed(1)} s)`);
  }
  if (failed && cleanup) {
    try {
      await Promise.race([cleanup(), sleep(5000)]);
    } catch (e) {
      console.log(`cleanup: ${e && e.message}`);
    }
  }
  if (!failed) {
    console.log(`PASSED ${title}: ${steps.length} steps in ${((Date.now() - started) / 1000).toFixed(1)} s`);
  }
  process.exit(failed ? 1 : 0);
}

module.exports = { STEP_WAIT_MS, StepFailed, addr, check, hostPort, poll, run, sleep };
