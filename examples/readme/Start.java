import io.kvarn.*;
import java.nio.*;

public class Start {
  static FloatBuffer data(int n) {  // model data, here a fixed pattern in a direct native buffer
    FloatBuffer b = ByteBuffer.allocateDirect(4 * n).order(ByteOrder.nativeOrder()).asFloatBuffer();
    for (int i = 0; i < n; i++) b.put(i, i * 7919L % 2001 / 1e3f - 1);
    return b;
  }

  public static void main(String[] args) {
    Config config = Config.fromPreset("k4v2_g128", 128);  // 4-bit K, 2-bit V, 128-token tiles
    try (Context ctx = new Context();                      // CPU, every core
         Cache cache = new Cache(ctx, config, 2, 2, 4096, 1)) {  // layers, Hk, tokens, sequences
      System.out.println("cache: " + cache.stats().bytesCapacity() + " bytes reserved");
      cache.addSequence(42);
      for (int layer = 0; layer < 2; layer++)              // k, v: [4000][Hk][D], unrotated
        cache.append(42, layer, data(4000 * 2 * 128), data(4000 * 2 * 128));
      FloatBuffer out = data(8 * 128);                     // decode, Hq 8: out [1][8][128]
      cache.attention(0, new long[] {42}, 8, data(8 * 128), out);
      CacheStats s = cache.stats();
      System.out.printf("%d tokens: %d bytes used, %d as fp16: %.2fx smaller%n", s.tokens(),
          s.bytesUsed(), s.fp16Bytes(), s.compressionRatio());
    }                                                      // failures: KvarnException.status()
  }
}
