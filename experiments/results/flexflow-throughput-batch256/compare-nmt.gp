# parasol compare: best predicted iteration time against search time.
$a0 << EOD
0.006519 446.649429
2.885123 446.649429

EOD
$a1 << EOD
0.003000 446.649429
0.114344 444.43556
0.223982 441.091266
1.634946 438.630663
2.116165 438.322473
2.142205 438.123779
2.843558 437.819897
2.917332 437.819897

EOD
$a2 << EOD
0.001778 446.649429
0.107988 444.43556
0.191459 441.091266
1.369097 438.630663
1.772077 438.322473
1.775755 438.123779
2.321424 437.819897
2.331616 437.615347
2.901696 437.615347

EOD
$a3 << EOD
0.002437 446.649429
0.512083 434.121765
2.874431 434.121765

EOD
if (strstrt(GPVAL_TERMINALS, 'pngcairo') > 0) {
  set terminal pngcairo size 960,600 font ',11'
} else {
  set terminal png size 960,600
}
set output 'compare-nmt.png'
set title 'nmt on flexflow-p100' noenhanced
set xlabel 'search time (s)'
set ylabel 'best predicted iteration time (ms)'
set key outside right top noenhanced
set grid
plot $a0 using 1:2 with steps linewidth 2 linecolor 1 title 'mcmc', \
     $a1 using 1:2 with steps linewidth 2 linecolor 2 title 'optcnn', \
     $a2 using 1:2 with steps linewidth 2 linecolor 3 title 'dp', \
     $a3 using 1:2 with steps linewidth 2 linecolor 4 title 'beam', \
     446.649429 with lines dashtype 2 linecolor 'gray' title 'data parallel'
