// The page's WebRTC call: the microphone's track out, the reply's track in, the events on "oai-events".
//
// As @openai/agents-realtime calls OpenAI: the offer is POSTed as application/sdp to /v1/realtime/calls with the
// key as a Bearer header, and the answer comes back (201). The server holds the playback buffer, so a barge-in is
// its to cut; the page only plays the track. app.js falls back to the WebSocket when this cannot connect.

export const CALLS = "/v1/realtime/calls";

// The server refused the call: its HTTP status and OpenAI-style error (status 0: the server was not reached).
export class CallRefused extends Error {
  constructor(status, code, message) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

function opened(channel, pc, timeoutMs) {
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`no connection within ${timeoutMs / 1000} s`)), timeoutMs);
    channel.addEventListener("open", () => { clearTimeout(timer); resolve(); });
    pc.addEventListener("connectionstatechange", () => {
      if (pc.connectionState === "failed") { clearTimeout(timer); reject(new Error("the connection failed")); }
    });
  });
}

// Opens a call from `stream` (the microphone); resolves to {pc, channel, remote, location} once the events
// channel is open. Rejects with CallRefused when the server says no, with an Error when it cannot connect.
export async function openCall(stream, apiKey, timeoutMs = 10000) {
  const pc = new RTCPeerConnection();
  const channel = pc.createDataChannel("oai-events");
  const early = [];  // events that come before the caller listens (session.created, at once)
  channel.onmessage = (event) => early.push(event);
  let remote = null;
  pc.ontrack = (event) => { remote = event.streams[0] || new MediaStream([event.track]); };
  pc.addTrack(stream.getAudioTracks()[0], stream);
  await pc.setLocalDescription(await pc.createOffer());
  let response;
  try {
    response = await fetch(`${CALLS}?model=s2s-page`, {method: "POST", body: pc.localDescription.sdp,
      cache: "no-store", headers: {"Content-Type": "application/sdp",
                                   ...(apiKey ? {Authorization: `Bearer ${apiKey}`} : {})}});
  } catch (error) {
    pc.close();
    throw new CallRefused(0, "unreachable", String(error));
  }
  if (response.status !== 201) {
    let error = {};
    try { error = (await response.json()).error || {}; } catch (ignored) { /* not JSON */ }
    pc.close();
    throw new CallRefused(response.status, error.code || "", error.message || response.statusText);
  }
  const location = response.headers.get("Location");
  try {
    await pc.setRemoteDescription({type: "answer", sdp: await response.text()});
    await opened(channel, pc, timeoutMs);
  } catch (error) {
    pc.close();
    if (location) fetch(location, {method: "DELETE", headers: apiKey ? {Authorization: `Bearer ${apiKey}`} : {}})
      .catch(() => {});  // its pipeline goes back now, not after server.call_connect_timeout_s
    throw error;
  }
  return {pc, channel, early, location,
          remote: remote || new MediaStream(pc.getReceivers().map((receiver) => receiver.track))};
}

// Plays the reply's track and meters it on the page's AudioContext (the capture worklet, on the reply): each
// 20 ms block goes to onBlock({frame, rms, length}), on the same frame clock as the microphone's chunks.
// Returns a function that stops both.
export function playReply(ctx, remote, onBlock) {
  const element = new Audio();
  element.autoplay = true;
  element.srcObject = remote;  // Chrome gives WebAudio a remote track's samples only while an element plays it
  const meter = new AudioWorkletNode(ctx, "s2s-capture", {numberOfInputs: 1, numberOfOutputs: 1,
    outputChannelCount: [1], processorOptions: {chunkFrames: Math.round(ctx.sampleRate * 0.02)}});
  const silent = ctx.createGain();
  silent.gain.value = 0;
  const source = ctx.createMediaStreamSource(remote);
  source.connect(meter).connect(silent).connect(ctx.destination);
  meter.port.onmessage = (event) => onBlock({frame: event.data.frame, rms: event.data.rms,
                                             length: event.data.pcm.byteLength / 2});
  meter.port.postMessage({type: "capture", on: true});
  return () => {
    meter.port.postMessage({type: "capture", on: false});
    source.disconnect();
    element.srcObject = null;
  };
}
