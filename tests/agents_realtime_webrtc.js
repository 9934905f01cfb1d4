// The official @openai/agents-realtime RealtimeSession over its WebRTC transport (OpenAIRealtimeWebRTC), in a
// browser: evaluated in a page of the s2s server's origin after the package's UMD bundle
// (dist/bundle/openai-realtime-agents.umd.js, the global OpenAIAgentsRealtime). The transport takes chromium's
// fake microphone itself (getUserMedia) and plays the reply in its own <audio> element; the test reads
// window.rtcReport: every server event type, the SDK's errors, transcripts, the interruptions and the peer
// connection's RTP statistics. tests/test_agents_realtime_webrtc.py runs it.
'use strict';
window.rtcReport = { events: [], errors: [], userTranscripts: [], transcripts: [], cleared: [], truncated: [],
                     started: [], stopped: [], interrupted: null, connected: false, stats: null, history: [] };

window.rtcStats = async function rtcStats(pc) {
  const found = { inbound: null, outbound: null, codecs: [] };
  (await pc.getStats()).forEach((entry) => {
    if (entry.type === 'inbound-rtp' && entry.kind === 'audio') {
      found.inbound = { packets: entry.packetsReceived, samples: entry.totalSamplesReceived,
                        energy: entry.totalAudioEnergy, codecId: entry.codecId };
    } else if (entry.type === 'outbound-rtp' && entry.kind === 'audio') {
      found.outbound = { packets: entry.packetsSent, bytes: entry.bytesSent };
    } else if (entry.type === 'codec') {
      found.codecs.push(entry.mimeType);
    }
  });
  return found;
};

window.runRtc = async function runRtc(plan) {
  const { OpenAIRealtimeWebRTC, RealtimeAgent, RealtimeSession } = window.OpenAIAgentsRealtime;
  const report = window.rtcReport;
  let peer = null;
  const transport = new OpenAIRealtimeWebRTC({ baseUrl: plan.url,
                                               changePeerConnection: async (pc) => { peer = pc; return pc; } });
  const agent = new RealtimeAgent({ name: 'Assistant', instructions: plan.instructions });
  const session = new RealtimeSession(agent, { transport });
  window.rtcSession = session;
  // The SDK's own interrupt() (response.cancel if a response is active, then output_audio_buffer.clear) while
  // the reply to the user's third turn plays: once its response is done (its audio was made faster than it
  // plays, so no cancel races the server's response.done) and it has played for a moment.
  const interruptLater = (id) => {
    const done = report.transcripts.some((reply) => reply.id === id);
    if (report.userTranscripts.length < 3 || report.interrupted !== null || !done || !report.started.includes(id)) {
      return;
    }
    report.interrupted = id;
    setTimeout(() => { if (!report.stopped.includes(id)) session.interrupt(); }, 300);
  };
  session.on('transport_event', (event) => {
    report.events.push(event.type);
    if (event.type === 'conversation.item.input_audio_transcription.completed') {
      report.userTranscripts.push(event.transcript);
    } else if (event.type === 'response.done' && event.response.status === 'completed') {
      const message = (event.response.output || []).find((item) => item.type === 'message');
      const said = message && message.content && message.content[0] ? message.content[0].transcript : '';
      report.transcripts.push({ id: event.response.id, text: said });
      interruptLater(event.response.id);
    } else if (event.type === 'output_audio_buffer.started') {
      report.started.push(event.response_id);
      interruptLater(event.response_id);
    } else if (event.type === 'output_audio_buffer.stopped') {
      report.stopped.push(event.response_id);
    } else if (event.type === 'output_audio_buffer.cleared') {
      report.cleared.push(event.response_id);
    } else if (event.type === 'conversation.item.truncated') {
      report.truncated.push(event.audio_end_ms);
    }
  });
  session.on('error', (error) => {
    const inner = error && error.error;
    let shown;
    try { shown = JSON.stringify(inner && inner.error ? inner.error : inner); } catch (e) { shown = String(inner); }
    report.errors.push(shown || String(inner));
  });
  await session.connect({ apiKey: plan.apiKey });
  report.connected = true;
  report.callId = transport.callId;
  window.rtcFinish = async () => {
    report.stats = await window.rtcStats(peer);
    report.history = session.history.map((item) => ({
      type: item.type, role: item.role, status: item.status,
      text: (item.content || []).map((part) => part.transcript || part.text || '').join(' '),
    }));
    session.close();
    return true;
  };
  return true;
};
