// The page's two audio processors, run on the AudioContext's render thread.
//
// Both count time in the context's frames (`currentFrame`), the one clock the page measures voice-to-voice on:
// a captured sample and a played sample are stamped on the same timeline, so their difference needs no
// guesswork about network or event-loop delays.

// s2s-capture: microphone -> PCM16 chunks of `chunkFrames`, each with the context frame of its first sample.
class Capture extends AudioWorkletProcessor {
  constructor(options) {
    super();
    this.chunkFrames = options.processorOptions.chunkFrames;
    this.buffer = new Int16Array(this.chunkFrames);
    this.filled = 0;
    this.firstFrame = 0;
    this.energy = 0;
    this.on = false;
    this.port.onmessage = (event) => {
      if (event.data.type === "capture") {
        this.on = event.data.on;
        this.filled = 0;
        this.energy = 0;
      }
    };
  }

  process(inputs) {
    const channels = inputs[0];
    if (!this.on || !channels || channels.length === 0) return true;  // no input this block: a gap, not zeros
    const frames = channels[0].length;
    for (let i = 0; i < frames; i++) {
      let sample = 0;
      for (let c = 0; c < channels.length; c++) sample += channels[c][i];
      sample = Math.max(-1, Math.min(1, sample / channels.length));
      if (this.filled === 0) this.firstFrame = currentFrame + i;
      this.buffer[this.filled++] = sample < 0 ? sample * 32768 : sample * 32767;
      this.energy += sample * sample;
      if (this.filled === this.chunkFrames) {
        const pcm = this.buffer.buffer;
        this.port.postMessage({type: "chunk", pcm, frame: this.firstFrame,
                               rms: Math.sqrt(this.energy / this.chunkFrames)}, [pcm]);
        this.buffer = new Int16Array(this.chunkFrames);
        this.filled = 0;
        this.energy = 0;
      }
    }
    return true;
  }
}

// s2s-playback: a queue of PCM16 blocks, each tagged with its response id, played back to back.
// It reports the context frame at which each response's first sample is written out ("started"), the samples
// played so far ("played", about every 100 ms while playing) and when the queue runs dry ("drained").
// "clear" drops everything queued at once (barge-in).
class Playback extends AudioWorkletProcessor {
  constructor() {
    super();
    this.queue = [];
    this.offset = 0;      // into queue[0]
    this.current = null;  // the response whose samples were written last
    this.played = 0;
    this.sinceReport = 0;
    this.playing = false;
    this.port.onmessage = (event) => {
      const message = event.data;
      if (message.type === "audio") {
        this.queue.push({id: message.id, samples: new Int16Array(message.pcm)});
      } else if (message.type === "clear") {
        let dropped = 0;
        for (const block of this.queue) dropped += block.samples.length;
        this.queue = [];
        this.port.postMessage({type: "cleared", dropped: dropped - this.offset, played: this.played});
        this.offset = 0;
      }
    };
  }

  process(inputs, outputs) {
    const out = outputs[0];
    const channel = out[0];
    let written = 0;
    while (written < channel.length && this.queue.length > 0) {
      const block = this.queue[0];
      if (this.offset === 0 && block.id !== this.current) {
        this.current = block.id;
        this.port.postMessage({type: "started", id: block.id, frame: currentFrame + written});
      }
      const count = Math.min(channel.length - written, block.samples.length - this.offset);
      for (let i = 0; i < count; i++) channel[written + i] = block.samples[this.offset + i] / 32768;
      written += count;
      this.offset += count;
      if (this.offset === block.samples.length) {
        this.queue.shift();
        this.offset = 0;
      }
    }
    for (let c = 1; c < out.length; c++) out[c].set(channel);
    this.played += written;
    this.sinceReport += written;
    if (written > 0) this.playing = true;
    if (this.sinceReport >= sampleRate / 10 || (this.playing && this.queue.length === 0)) {
      this.port.postMessage({type: "played", played: this.played});
      this.sinceReport = 0;
    }
    if (this.playing && this.queue.length === 0) {
      this.playing = false;
      this.port.postMessage({type: "drained", played: this.played});
    }
    return true;
  }
}

registerProcessor("s2s-capture", Capture);
registerProcessor("s2s-playback", Playback);
