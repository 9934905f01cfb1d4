// The official @openai/agents-realtime RealtimeSession (WebSocket transport) against the s2s server.
//   node tests/agents_realtime_client.js '<plan as JSON>'
// The plan: {url, apiKey, scenario: speak|ask|interrupt|resume, instructions, question, speech, interruption,
// listenMs, result, timeoutMs, turnDetection (the session's, as the SDK spells it)}; speech files are raw PCM16
// mono at 24 kHz. One JSON line comes out: every server event type, the SDK's errors, its tool calls, the
// transcripts, the items the server deleted and its history. tests/test_agents_realtime_js.py runs it.
'use strict';
const fs = require('fs');
const { RealtimeAgent, RealtimeSession, tool } = require('@openai/agents-realtime');
const { z } = require('zod');

const plan = JSON.parse(process.argv[2]);
const report = { events: [], errors: [], toolCalls: [], transcripts: [], userTranscripts: [], audioBytes: 0,
                 truncated: [], deleted: [], timedOut: false };

const getWeather = tool({
  name: 'get_weather', description: 'Current weather in a city.',
  parameters: z.object({ city: z.string() }),
  execute: async ({ city }) => { report.toolCalls.push(city); return plan.result; },
});
const agent = new RealtimeAgent({ name: 'Assistant', instructions: plan.instructions, tools: [getWeather] });
const session = new RealtimeSession(agent, { transport: 'websocket', ...(plan.turnDetection
  ? { config: { audio: { input: { turnDetection: plan.turnDetection } } } } : {}) });

let waiters = [];
function check() { waiters = waiters.filter(({ test, resolve }) => (test() ? (resolve(), false) : true)); }
function until(test) { return new Promise((resolve) => { waiters.push({ test, resolve }); check(); }); }
const completed = () => report.transcripts.length;

session.on('transport_event', (event) => {
  report.events.push(event.type);
  if (event.type === 'response.output_audio.delta') report.audioBytes += Buffer.from(event.delta, 'base64').length;
  if (event.type === 'response.done' && event.response.status === 'completed') {
    const message = (event.response.output || []).find((item) => item.type === 'message');
    const said = message && message.content && message.content[0] ? message.content[0].transcript : '';
    if (said) report.transcripts.push(said);
  }
  if (event.type === 'conversation.item.input_audio_transcription.completed') {
    report.userTranscripts.push(event.transcript);
  }
  if (event.type === 'conversation.item.truncated') report.truncated.push(event.audio_end_ms);
  if (event.type === 'conversation.item.deleted') report.deleted.push(event.item_id);
  check();
});
session.on('error', (error) => {
  const inner = error && error.error;
  let shown;
  try { shown = JSON.stringify(inner && inner.error ? inner.error : inner); } catch (e) { shown = String(inner); }
  report.errors.push(shown || String(inner));
});

function send(path) {
  const pcm = fs.readFileSync(path);
  const step = 4800; // 100 ms of PCM16 at 24 kHz
  for (let start = 0; start < pcm.length; start += step) {
    const block = pcm.subarray(start, Math.min(start + step, pcm.length));
    session.sendAudio(block.buffer.slice(block.byteOffset, block.byteOffset + block.length));
  }
}

function history() {
  return session.history.map((item) => ({
    type: item.type, role: item.role, status: item.status, name: item.name,
    text: (item.content || []).map((part) => part.transcript || part.text || '').join(' '),
  }));
}

async function main() {
  await session.connect({ apiKey: plan.apiKey, url: plan.url });
  if (plan.scenario === 'speak') {
    send(plan.speech);
    await until(() => completed() >= 1);
  } else if (plan.scenario === 'ask') {
    session.sendMessage(plan.question);
    await until(() => completed() >= 1 && (plan.expectTool ? report.toolCalls.length > 0 : true));
  } else if (plan.scenario === 'interrupt') {
    send(plan.speech);
    await until(() => report.events.includes('response.output_audio.delta'));
    // the user listens for a while (the SDK counts what was heard from the first delta on, by the wall clock)
    await new Promise((resolve) => setTimeout(resolve, plan.listenMs || 0));
    send(plan.interruption);
    await until(() => report.truncated.length > 0 && completed() >= 1);
  } else if (plan.scenario === 'resume') {
    // a sentence with a pause in it, said at once: the turn ends in the pause, the speaker goes on
    send(plan.speech);
    await until(() => report.deleted.length > 0 && completed() >= 1
      && report.events.lastIndexOf('response.done') > report.events.indexOf('conversation.item.deleted'));
  }
  await new Promise((resolve) => setTimeout(resolve, 500)); // the SDK's own retrieve after the last event
}

const timer = setTimeout(() => { report.timedOut = true; finish(); }, plan.timeoutMs || 120000);
function finish() {
  clearTimeout(timer);
  report.history = history();
  process.stdout.write(JSON.stringify(report) + '\n');
  try { session.close(); } catch (e) { /* already closed */ }
  process.exit(0);
}
main().then(finish, (error) => { report.errors.push(`client: ${error && error.stack || error}`); finish(); });
