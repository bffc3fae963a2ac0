import io.kvarn.*;
import java.nio.*;
import java.util.Random;

public class Start {
  static FloatBuffer direct(int n) {  // direct, native byte order: what the cache reads
    return ByteBuffer.allocateDirect(4 * n).order(ByteOrder.nativeOrder()).asFloatBuffer();
  }

  static FloatBuffer random(Random rng, int n) {  // model data: here random
    FloatBuffer b = direct(n);
    for (int i = 0; i < n; i++) b.put(i, (float) rng.nextGaussian());
    return b;
  }

  public static void main(String[] args) {
    Random rng = new Random(0);
    Config config = Config.fromPreset("k4v2_g128", 128);  // 4-bit K, 2-bit V, 128-token tiles
    try (Context ctx = new Context();                      // CPU, every core
         Cache cache = new Cache(ctx, config, 2, 2, 4096, 1)) {  // layers, Hk, tokens, sequences
      System.out.println("cache: " + cache.stats().bytesCapacity() + " bytes reserved");
      cache.addSequence(42);
      for (int layer = 0; layer < 2; layer++)              // k, v: [4000][Hk][D], unrotated
        cache.append(42, layer, random(rng, 4000 * 2 * 128), random(rng, 4000 * 2 * 128));
      FloatBuffer out = direct(8 * 128);
      cache.attention(0, new long[] {42}, 8, random(rng, 8 * 128), out);  // decode, Hq 8
      CacheStats s = cache.stats();
      System.out.printf("%d tokens: %d bytes used, %d as fp16: %.2fx smaller%n", s.tokens(),
          s.bytesUsed(), s.fp16Bytes(), s.compressionRatio());
    }                                                      // failures: KvarnException.status()
  }
}
