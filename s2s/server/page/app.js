// The s2s page: the microphone into the realtime server, the reply out of the speakers.
//
// No build step: module scripts, the worklets in audio-worklet.js, the markup in index.html. A WebRTC call by
// default (rtc.js: Opus both ways, the events on a data channel); the WebSocket (/v1/realtime) when the browser or
// the server has no WebRTC, the call cannot connect, or the URL says ?transport=websocket. Over the WebSocket one
// AudioContext at the device's rate both captures and plays; session.update tells the server that rate for both
// directions, so the server (soxr) does all resampling and the page none. window.s2sStats mirrors the page.
import {CallRefused, openCall, playReply} from "/page/rtc.js";

const PATH = "/v1/realtime";
const VOICED_RMS = 0.01;     // a microphone chunk or reply block louder than this has sound in it (WebRTC timing)
const CHUNK_S = 0.05;        // one input_audio_buffer.append per 50 ms of microphone audio
const KEY_STORE = "s2s.apiKey";
const KEY_PROTOCOL = "openai-insecure-api-key.";  // how browser clients offer a key: no headers on a WebSocket
const MAX_CHUNKS = 6000;     // sent chunks remembered for the clock mapping (5 minutes)

const $ = (id) => document.getElementById(id);
const ui = {start: $("start"), stop: $("stop"), status: $("status"), message: $("message"), keyForm: $("key-form"),
            key: $("key"), remember: $("remember"), transcript: $("transcript"), level: $("level"),
            v2v: $("stat-v2v"), median: $("stat-median"), sent: $("stat-sent"), played: $("stat-played"),
            rate: $("stat-rate")};

const stats = {state: "idle", message: null, rate: 0, sentChunks: 0, sentSamples: 0, receivedSamples: 0,
               playedSamples: 0, bargeIns: 0, voiceToVoiceMs: [], transcript: [], errors: [],
               transport: new URLSearchParams(location.search).get("transport") === "websocket"
                 || !window.RTCPeerConnection ? "websocket" : "webrtc", fallback: null};
window.s2sStats = stats;

// The key lives in this variable; sessionStorage only when the user ticked the box (it ends with the tab).
let apiKey = sessionStorage.getItem(KEY_STORE);
let audio = null;  // {ctx, stream, capture, playback, posted, dropped}
let call = null;   // the current connection and what it has learnt

// ------------------------------------------------------------------ what the page shows
function setState(state) {
  stats.state = state;
  ui.status.dataset.state = state;
  ui.status.textContent = {idle: "idle", starting: "starting…", connecting: "connecting…", key: "API key needed",
                           listening: "listening", speaking: "speaking", error: "stopped"}[state] || state;
  const active = ["starting", "connecting", "listening", "speaking"].includes(state);
  ui.start.disabled = active;
  ui.stop.disabled = !active && state !== "key";
}

function showMessage(kind, text, tone = "error") {
  stats.message = kind;
  ui.message.hidden = false;
  ui.message.dataset.kind = kind;
  ui.message.className = `message ${tone}`;
  ui.message.textContent = text;
}

function clearMessage() {
  stats.message = null;
  ui.message.hidden = true;
  ui.message.textContent = "";
  delete ui.message.dataset.kind;
}

function line(role, id) {
  let entry = stats.transcript.find((item) => item.role === role && item.id === id);
  if (!entry) {
    entry = {role, id, text: "", voiceToVoiceMs: null, status: null};
    stats.transcript.push(entry);
    const li = document.createElement("li");
    li.className = `turn ${role}`;
    li.dataset.id = id;
    li.innerHTML = `<div class="who">${role === "user" ? "you" : "assistant"}</div><div class="text"></div>` +
                   `<div class="meta"></div>`;
    ui.transcript.append(li);
    entry.element = li;
    li.scrollIntoView({block: "end"});
  }
  return entry;
}

function setText(entry, text) {
  entry.text = text;
  entry.element.querySelector(".text").textContent = text;
}

function setMeta(entry) {
  const parts = [];
  if (entry.voiceToVoiceMs !== null) parts.push(`voice-to-voice ${(entry.voiceToVoiceMs / 1000).toFixed(2)} s`);
  if (entry.status === "cancelled" || entry.status === "interrupted") parts.push("interrupted");
  entry.element.querySelector(".meta").textContent = parts.join(" · ");
  entry.element.classList.toggle("cut", entry.status === "cancelled" || entry.status === "interrupted");
}

function showStats() {
  const rate = stats.rate || 1;
  ui.sent.textContent = `${(stats.sentSamples / rate).toFixed(1)} s`;
  ui.played.textContent = `${(stats.playedSamples / rate).toFixed(1)} s`;
  ui.rate.textContent = stats.rate ? `${stats.rate / 1000} kHz` : "–";
  const figures = stats.voiceToVoiceMs;
  if (figures.length) {
    const sorted = [...figures].sort((a, b) => a - b);
    const middle = sorted.length >> 1;
    const median = sorted.length % 2 ? sorted[middle] : (sorted[middle - 1] + sorted[middle]) / 2;
    ui.v2v.textContent = `${(figures[figures.length - 1] / 1000).toFixed(2)} s`;
    ui.median.textContent = `${(median / 1000).toFixed(2)} s (${figures.length})`;
  }
}

// ------------------------------------------------------------------ audio
// PCM16 is little-endian on the wire, as typed arrays are on every platform a browser runs on.
function toBase64(buffer) {
  const bytes = new Uint8Array(buffer);
  let binary = "";
  for (let i = 0; i < bytes.length; i += 0x8000) {
    binary += String.fromCharCode.apply(null, bytes.subarray(i, i + 0x8000));
  }
  return btoa(binary);
}

function fromBase64(text) {
  const binary = atob(text);
  const bytes = new Uint8Array(binary.length);
  for (let i = 0; i < binary.length; i++) bytes[i] = binary.charCodeAt(i);
  return bytes.buffer;
}

async function openAudio(ctx) {
  if (ctx.sampleRate < 8000 || ctx.sampleRate > 48000) {  // outside what the server takes (server.min/max_rate)
    await ctx.close();
    ctx = new AudioContext({latencyHint: "interactive", sampleRate: 48000});
  }
  await ctx.resume();
  const stream = await navigator.mediaDevices.getUserMedia({audio: {
    channelCount: 1, echoCancellation: true, noiseSuppression: true, autoGainControl: true}});
  try {
    await ctx.audioWorklet.addModule("/page/audio-worklet.js");
    const capture = new AudioWorkletNode(ctx, "s2s-capture", {
      numberOfInputs: 1, numberOfOutputs: 1, outputChannelCount: [1],
      processorOptions: {chunkFrames: Math.round(ctx.sampleRate * CHUNK_S)}});
    const silent = ctx.createGain();
    silent.gain.value = 0;  // the capture node is pulled by the graph only when it leads to the destination
    ctx.createMediaStreamSource(stream).connect(capture).connect(silent).connect(ctx.destination);
    const playback = new AudioWorkletNode(ctx, "s2s-playback", {numberOfInputs: 0, numberOfOutputs: 1,
                                                                outputChannelCount: [1]});
    playback.connect(ctx.destination);
    const opened = {ctx, stream, capture, playback, posted: 0, dropped: 0};
    capture.port.onmessage = (event) => onChunk(opened, event.data);
    playback.port.onmessage = (event) => onPlayback(opened, event.data);
    return opened;
  } catch (error) {
    stream.getTracks().forEach((track) => track.stop());
    throw error;
  }
}

function closeAudio() {
  if (!audio) return;
  audio.stream.getTracks().forEach((track) => track.stop());
  audio.ctx.close().catch(() => {});
  audio = null;
  ui.level.style.width = "0";
}

function queued() {
  return audio !== null && audio.posted - audio.dropped - stats.playedSamples > 0;
}

function onChunk(source, chunk) {
  if (source !== audio) return;
  ui.level.style.width = `${Math.min(100, Math.sqrt(chunk.rms) * 250)}%`;
  if (!call || !call.ready || !call.isOpen()) return;
  const length = chunk.pcm.byteLength / 2;
  if (call.kind === "webrtc") {  // the track carries the sound; the chunk only times the end of speech
    if (chunk.rms > VOICED_RMS) call.lastVoiced = chunk.frame + length;
  } else {
    call.transmit(JSON.stringify({type: "input_audio_buffer.append", audio: toBase64(chunk.pcm)}));
  }
  call.chunks.push({sample: call.sent, frame: chunk.frame, length});
  if (call.chunks.length > MAX_CHUNKS) call.chunks.splice(0, call.chunks.length - MAX_CHUNKS);
  call.sent += length;
  stats.sentChunks += 1;
  stats.sentSamples += length;
  showStats();
}

function onPlayback(source, message) {
  if (source !== audio) return;
  if (message.type === "played") {
    stats.playedSamples = message.played;
    showStats();
  } else if (message.type === "cleared") {
    audio.dropped += message.dropped;
  } else if (message.type === "drained") {
    stats.playedSamples = message.played;
    if (stats.state === "speaking") setState("listening");
  } else if (message.type === "started") {
    if (call && call.ready) setState("speaking");
    measure(message.id, message.frame);
  }
}

// ------------------------------------------------------------------ voice-to-voice on the page's clock
// The figure runs from the end of the user's speech to the first reply sample played, both on the AudioContext's
// frame clock: the capture worklet stamps each chunk with the frame of its first sample, the playback worklet
// reports the frame at which a response's first sample goes out.
//
// The end of speech comes from speech_stopped's audio_end_ms, not from when that event arrives: audio_end_ms is
// on the server's input clock (milliseconds of the audio this page appended, counted from the first append) and
// marks the end of the audio the VAD kept, which is the last voiced frame plus the VAD's pad (shown as
// turn_detection.prefix_padding_ms). Less the pad, it is the last voiced frame, the start of the server's own
// voice_to_voice_s, and the chunks sent map it back onto the frame at which the microphone delivered it. The
// other way, the arrival time minus the silence wait, would fold the network, the VAD's frame steps and the
// event loop into the figure; this mapping is exact to about one VAD frame (32 ms: the pad is rounded up to
// whole frames). What neither can see is the microphone's own input latency, before the worklet gets a sample.
function captureFrame(sample) {
  const chunks = call.chunks;
  for (let i = chunks.length - 1; i >= 0; i--) {
    if (chunks[i].sample <= sample) return chunks[i].frame + (sample - chunks[i].sample);
  }
  return chunks.length ? chunks[0].frame : 0;
}

function speechStopped(event) {
  if (call.kind === "webrtc") {  // the server's input clock is the track's: the page times its own loud chunks
    call.speechEnd = {itemId: event.item_id, frame: call.lastVoiced};
    return;
  }
  const endMs = Math.max(0, event.audio_end_ms - call.padMs);
  call.speechEnd = {itemId: event.item_id, frame: captureFrame(Math.round(endMs * call.rate / 1000))};
}

function measure(responseId, playedFrame) {
  if (!call || !call.speechEnd || call.cut.has(responseId)) return;
  // the worklet's frame is when the sample leaves the page; it reaches the speaker outputLatency later
  const latency = audio && audio.ctx.outputLatency ? audio.ctx.outputLatency : 0;
  const ms = ((playedFrame - call.speechEnd.frame) / call.rate + latency) * 1000;
  call.speechEnd = null;
  const entry = line("assistant", responseId);
  entry.voiceToVoiceMs = Math.round(ms);
  setMeta(entry);
  stats.voiceToVoiceMs.push(Math.round(ms));
  showStats();
}

// ------------------------------------------------------------------ the connection
function connect() {
  if (stats.transport === "webrtc") connectRtc();
  else connectWebSocket();
}

function fallBack(reason) {
  stats.transport = "websocket";
  stats.fallback = reason;
  console.info(`s2s: ${reason}; talking over the WebSocket instead`);
  connectWebSocket();
}

async function connectRtc() {
  setState("connecting");
  const mine = {kind: "webrtc", opened: false, ready: false, ended: false, userClosed: false, padMs: 0,
                rate: audio.ctx.sampleRate, sent: 0, chunks: [], speechEnd: null, current: null, cut: new Set(),
                lastVoiced: 0, isOpen: () => false, transmit: () => {}, close: () => {}};
  call = mine;
  let opened;
  try {
    opened = await openCall(audio.stream, apiKey);
  } catch (error) {
    if (call !== mine) return;  // stopped meanwhile
    call = null;
    if (!(error instanceof CallRefused)) fallBack(`the WebRTC call did not connect (${error.message})`);
    else if ([404, 405, 501].includes(error.status)) fallBack(`this server takes no WebRTC calls (${error.message})`);
    else refused(error.status, error.code, error.message);
    return;
  }
  const stopReply = playReply(audio.ctx, opened.remote, (block) => onReplyBlock(mine, block));
  Object.assign(mine, {opened: true, isOpen: () => opened.channel.readyState === "open",
                       transmit: (text) => opened.channel.send(text),
                       close: () => { stopReply(); opened.channel.close(); opened.pc.close(); }});
  if (call !== mine) { mine.close(); return; }
  const take = (event) => { if (call === mine) onEvent(mine, JSON.parse(event.data)); };
  opened.channel.onmessage = take;
  opened.early.forEach(take);
  opened.channel.onclose = () => { stopReply(); onClose(mine, {code: 1006, reason: "the call ended"}); };
}

// A block of the reply's track as the page plays it: sound in it is the reply heard (and the first after the
// user's speech times the turn, on the same frame clock as the microphone's chunks).
function onReplyBlock(mine, block) {
  if (call !== mine || block.rms <= VOICED_RMS) return;
  stats.receivedSamples += block.length;
  stats.playedSamples += block.length;
  if (mine.speechEnd && mine.lastReply) measure(mine.lastReply, block.frame);
  showStats();
}

function connectWebSocket() {
  const scheme = location.protocol === "https:" ? "wss" : "ws";
  const protocols = apiKey ? ["realtime", KEY_PROTOCOL + apiKey] : ["realtime"];
  let ws;
  try {
    ws = new WebSocket(`${scheme}://${location.host}${PATH}?model=s2s-page`, protocols);
  } catch (error) {  // SyntaxError: the key holds characters a subprotocol cannot carry
    showMessage("key-unusable", "This API key has characters a browser cannot send (letters, digits and " +
                "-_.~ only). Use such a key for server.api_key, or connect with python -m s2s.client.");
    askKey();
    return;
  }
  setState("connecting");
  call = {kind: "websocket", ws, opened: false, ready: false, ended: false, userClosed: false,
          rate: audio.ctx.sampleRate, padMs: 0, sent: 0, chunks: [], speechEnd: null, current: null, cut: new Set(),
          isOpen: () => ws.readyState === WebSocket.OPEN, transmit: (text) => ws.send(text),
          close: () => ws.close(1000, "the user stopped")};
  const mine = call;
  ws.onopen = () => { mine.opened = true; };
  ws.onmessage = (event) => { if (call === mine) onEvent(mine, JSON.parse(event.data)); };
  ws.onclose = (event) => onClose(mine, event);
}

function send(event) {
  if (call && call.isOpen()) call.transmit(JSON.stringify(event));
}

function bargeIn() {
  // the user speaks over the reply: what is still queued here must go at once, whatever the server cancels
  if (queued()) {
    audio.playback.port.postMessage({type: "clear"});
    stats.bargeIns += 1;
    for (const entry of stats.transcript) {
      if (entry.role === "assistant" && entry.status === null && entry.id === call.lastReply) {
        entry.status = "interrupted";
        setMeta(entry);
      }
    }
  }
  if (call.current) call.cut.add(call.current);  // deltas still on their way are not played
  if (stats.state === "speaking") setState("listening");
}

function onEvent(mine, event) {
  switch (event.type) {
    case "session.created": {
      if (mine.kind === "webrtc") {  // Opus both ways: no PCM rate to agree on
        ready(mine);
        break;
      }
      const rate = mine.rate;
      send({type: "session.update", session: {type: "realtime", audio: {
        input: {format: {type: "audio/pcm", rate}}, output: {format: {type: "audio/pcm", rate}}}}});
      break;
    }
    case "session.updated": {
      if (mine.ready) break;
      const format = event.session.audio;
      if (format.input.format.rate !== mine.rate || format.output.format.rate !== mine.rate) {
        showMessage("rate", `The server did not take this page's audio rate (${mine.rate} Hz).`);
        stop(false);
        break;
      }
      mine.padMs = format.input.turn_detection.prefix_padding_ms || 0;
      ready(mine);
      break;
    }
    case "output_audio_buffer.started":
      if (mine.ready) setState("speaking");
      break;
    case "output_audio_buffer.stopped":
      if (stats.state === "speaking") setState("listening");
      break;
    case "output_audio_buffer.cleared": {  // the server cut the reply's audio (the user spoke over it)
      stats.bargeIns += 1;
      const entry = line("assistant", event.response_id);
      if (entry.status === null) entry.status = "interrupted";
      setMeta(entry);
      if (stats.state === "speaking") setState("listening");
      break;
    }
    case "input_audio_buffer.speech_started":
      line("user", event.item_id);
      bargeIn();
      break;
    case "input_audio_buffer.speech_stopped":
      speechStopped(event);
      break;
    case "conversation.item.input_audio_transcription.delta": {
      const entry = line("user", event.item_id);
      setText(entry, entry.text + event.delta);
      break;
    }
    case "conversation.item.input_audio_transcription.completed":
      setText(line("user", event.item_id), event.transcript);
      break;
    case "response.created":
      mine.current = event.response.id;
      mine.lastReply = event.response.id;
      line("assistant", event.response.id);
      break;
    case "response.output_audio_transcript.delta": {
      const entry = line("assistant", event.response_id);
      setText(entry, entry.text + event.delta);
      break;
    }
    case "response.output_audio_transcript.done":
      setText(line("assistant", event.response_id), event.transcript);
      break;
    case "response.output_audio.delta": {
      if (mine.cut.has(event.response_id) || !audio) break;
      const pcm = fromBase64(event.delta);
      audio.posted += pcm.byteLength / 2;
      stats.receivedSamples += pcm.byteLength / 2;
      audio.playback.port.postMessage({type: "audio", id: event.response_id, pcm}, [pcm]);
      break;
    }
    case "response.done": {
      const entry = line("assistant", event.response.id);
      if (event.response.status !== "completed" && entry.status === null) entry.status = event.response.status;
      setMeta(entry);
      if (mine.current === event.response.id) mine.current = null;
      break;
    }
    case "error":
      onServerError(mine, event.error);
      break;
    default:
      break;
  }
}

function ready(mine) {
  mine.ready = true;
  stats.rate = mine.rate;
  audio.capture.port.postMessage({type: "capture", on: true});
  clearMessage();
  setState("listening");
  showStats();
}

function serverFull() {
  showMessage("server-full", "The server is full: every session it has room for is in use " +
              "(server.max_sessions). Try again in a moment.");
}

// The server said no to a call (an HTTP status and an OpenAI-style error), or could not be reached (status 0).
function refused(status, code, message) {
  if (status === 401) {
    keyRefused();
    return;
  }
  closeAudio();
  setState("error");
  if (code) stats.errors.push(code);
  if (code === "session_limit_reached") serverFull();
  else if (status === 0) showMessage("unreachable", `Cannot reach the server at ${location.host}. Is it still running?`);
  else showMessage("refused", `The server refused the call (HTTP ${status}: ${message}). See the server's log.`);
}

function keyRefused() {
  if (apiKey) {
    showMessage("wrong-key", "The server refused this API key (401, invalid_api_key). Check it " +
                "(server.api_key or S2S_API_KEY where the server runs) and enter it again.");
    forgetKey();
  } else {
    showMessage("key-needed", "This server needs an API key. The page keeps it in memory only, " +
                "unless you tick the box.", "info");
  }
  askKey();
}

function onServerError(mine, error) {
  stats.errors.push(error.code);
  if (error.code === "session_limit_reached") {
    mine.ended = true;
    serverFull();
  } else if (error.code === "idle_timeout") {
    mine.ended = true;
    showMessage("idle", "The server closed the session after a long silence. Press Start to talk again.", "info");
  } else if (!mine.ready) {  // the session.update of the audio rate was refused: this page cannot talk to it
    mine.ended = true;
    showMessage("refused-setup", `The server refused this page's audio settings: ${error.message}`);
    stop(false);
  } else {
    showMessage("server-error", `The server reported ${error.code}: ${error.message}`);
  }
}

async function onClose(mine, event) {
  if (call === mine) call = null;
  if (mine.userClosed) return;
  if (mine.ended) {  // the server said why before it closed
    closeAudio();
    setState("error");
    return;
  }
  if (!mine.opened) {
    await diagnose();
    return;
  }
  closeAudio();
  setState("error");
  showMessage("dropped", `The connection to the server dropped (code ${event.code}` +
              `${event.reason ? `: ${event.reason}` : ""}). Press Start to reconnect.`);
}

// A browser hides the HTTP status of a refused WebSocket handshake (every failure is close code 1006), so the
// page asks an endpoint that needs the same key, over fetch, which can send it as a header.
async function diagnose() {
  let status = 0;
  try {
    const response = await fetch("/v1/sessions", {cache: "no-store", headers: apiKey
      ? {Authorization: `Bearer ${apiKey}`} : {}});
    status = response.status;
  } catch (error) {
    status = 0;
  }
  if (status === 401) {
    keyRefused();
    return;
  }
  closeAudio();
  setState("error");
  if (status === 0) {
    showMessage("unreachable", `Cannot reach the server at ${location.host}. Is it still running?`);
  } else {
    showMessage("refused", `The server refused the connection (HTTP ${status} for the API check; the ` +
                "WebSocket handshake failed). See the server's log.");
  }
}

// ------------------------------------------------------------------ the key
function askKey() {
  setState("key");
  ui.keyForm.hidden = false;
  ui.key.value = "";
  ui.key.focus();
}

function forgetKey() {
  apiKey = null;
  sessionStorage.removeItem(KEY_STORE);
}

ui.keyForm.addEventListener("submit", async (event) => {
  event.preventDefault();
  const key = ui.key.value.trim();
  if (!key) return;
  apiKey = key;
  if (ui.remember.checked) sessionStorage.setItem(KEY_STORE, key);
  else sessionStorage.removeItem(KEY_STORE);
  ui.key.value = "";
  ui.keyForm.hidden = true;
  clearMessage();
  if (audio) connect();
  else await start();
});

// ------------------------------------------------------------------ start and stop
async function start() {
  if (call || audio) stop(true);  // Start again while the key form waits: a fresh microphone and connection
  clearMessage();
  if (!window.isSecureContext || !navigator.mediaDevices || !window.AudioWorkletNode) {
    showMessage("insecure", "The microphone needs a secure page: open it as http://localhost:PORT or " +
                "http://127.0.0.1:PORT on the server's machine, or serve it over https.");
    setState("error");
    return;
  }
  setState("starting");
  const ctx = new AudioContext({latencyHint: "interactive"});  // made in the click, so it may play
  try {
    audio = await openAudio(ctx);
  } catch (error) {
    ctx.close().catch(() => {});
    audio = null;
    setState("error");
    if (error.name === "NotAllowedError" || error.name === "SecurityError") {
      showMessage("mic-refused", "Microphone access was refused. Allow the microphone for this site (the " +
                  "icon in the address bar), then press Start again.");
    } else if (error.name === "NotFoundError" || error.name === "OverconstrainedError") {
      showMessage("no-mic", "No microphone was found. Plug one in, then press Start again.");
    } else if (error.name === "NotReadableError") {
      showMessage("mic-busy", "The microphone is in use by another program or cannot be read.");
    } else {
      showMessage("audio-failed", `The page could not open the audio: ${error.name}: ${error.message}`);
    }
    return;
  }
  connect();
}

function stop(byUser = true) {
  if (call) {
    call.userClosed = byUser || call.userClosed;
    call.ended = true;
    call.close();
    call = null;
  }
  closeAudio();
  ui.keyForm.hidden = true;
  setState(byUser ? "idle" : "error");
}

ui.start.addEventListener("click", () => { start(); });
ui.stop.addEventListener("click", () => stop(true));
setState("idle");
